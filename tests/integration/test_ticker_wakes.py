"""Issue 36: while events flow, a committed batch wakes the ticker only when it brings a due
time before the ticker's wake-up (runtime/ticker.py); the cursor's save a second sets the pace.
Woken by every batch, the ticker looked at every due time once per event."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from ntfy_intake.runtime import ticker
from ntfy_intake.testbed.emulator import NtfyEmulator

from ..harness import DaemonThread, event_ids, query, settings_for, wait_until
from .test_idle_ticks import count_passes

EVENTS = 20
RATE = 10.0  # events a second: one batch each


@pytest.mark.emulator(keepalive_interval=45.0)
def test_events_flowing_do_not_wake_the_ticker_once_per_batch(
    emu: NtfyEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[float] = []
    wait = ticker.Ticker._wait

    def counted(self: ticker.Ticker) -> float:
        looks.append(time.monotonic())
        return wait(self)

    monkeypatch.setattr(ticker.Ticker, "_wait", counted)
    config = settings_for(emu.url, tmp_path, ntfy_keepalive_interval="45s")
    with DaemonThread(config):
        emu.wait_for_subscribers(1, timeout=30)
        time.sleep(1.5)  # start-up: the overlap poll and its writes
        published: list[str] = []
        start = time.monotonic()
        before = len(looks)
        for i in range(EVENTS):
            time.sleep(max(0.0, start + i / RATE - time.monotonic()))
            published.append(emu.publish("alerts", f"flowing #{i}")["id"])
        wait_until(lambda: set(published) <= set(event_ids(tmp_path)), 10, "recorded")
        during = len(looks) - before
        # The cursor still follows them (saved once its reorder window passed).
        wait_until(lambda: cursor_value(tmp_path) == published[-1], 10, "the cursor moved")
    # 2 s of events: a pass or two a second (the cursor's save, the frame time's, the
    # snapshot's), each one look; a wake-up per batch made 20 more.
    assert during <= EVENTS // 2, during


@pytest.mark.emulator(keepalive_interval=45.0)
def test_events_flowing_cost_the_ticker_one_pass_a_second_not_two(
    emu: NtfyEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cursor's save and the last frame time's, each at most once a second, fell due a
    few ms apart: two passes a second while events flowed. The frame time now goes with the
    cursor's save, and work due within the gather window waits for one pass."""
    passes = count_passes(monkeypatch)
    config = settings_for(emu.url, tmp_path, ntfy_keepalive_interval="45s")
    seconds = 4.0
    with DaemonThread(config):
        emu.wait_for_subscribers(1, timeout=30)
        time.sleep(1.5)
        start = time.monotonic()
        for i in range(int(seconds * RATE)):
            time.sleep(max(0.0, start + i / RATE - time.monotonic()))
            emu.publish("alerts", f"flowing #{i}")
        during = [at for at in passes if at >= start + 1.0]  # past the first save's phase
    # About one a second over the last 3 s (the snapshot's every 2 s rides along); two a
    # second made 6 or more.
    assert len(during) <= 4, [round(b - a, 3) for a, b in itertools.pairwise(during)]


def cursor_value(state_dir: Path) -> str | None:
    rows = query(state_dir, "SELECT value FROM cursor")
    return None if not rows else str(rows[0][0])
