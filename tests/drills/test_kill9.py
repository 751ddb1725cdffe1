"""kill -9 during a steady stream, at least five times: exactly one audit event line per id.

Written straight on tests/harness.py (real `ntfy-intake run` subprocesses against the bundled
emulator), independent of the drill, so a bug in drill.py cannot hide a bug in the daemon.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import daemon_process, env_for, event_ids, query, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.engines]

KILLS = 6
CATCH_UP = 30.0


class SteadyStream:
    """Publishes one message every 20-40 ms on alternating topics until stopped."""

    def __init__(self, emu: NtfyEmulator, rng: random.Random) -> None:
        self.emu = emu
        self.rng = rng
        self.ids: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            topic = "alerts" if n % 2 else "backups"
            event = self.emu.publish(topic, f"steady #{n}", title=f"steady {n % 7}")
            with self._lock:
                self.ids.append(event["id"])
            self._stop.wait(self.rng.uniform(0.02, 0.04))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.ids)


def recorded_all(state: Path, ids: list[str]) -> bool:
    return set(ids) <= set(event_ids(state))


def test_kill9_during_steady_stream_leaves_exactly_one_event_line_per_id(tmp_path: Path) -> None:
    rng = random.Random(20251129)
    state = tmp_path / "state"
    kills = 0
    published_while_down = 0
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu:
        env = env_for(emu.url, state, cadence_debounce="0s", ntfy_reorder_window="300ms")
        stream = SteadyStream(emu, rng)
        try:
            for lifetime in range(KILLS):
                before = stream.snapshot()
                with daemon_process(env) as proc:
                    if lifetime == 0:
                        emu.wait_for_subscribers(1, timeout=CATCH_UP)
                        stream.start()
                    else:
                        # Everything published up to and during the downtime gets recorded ...
                        wait_until(
                            lambda before=before: recorded_all(state, before),
                            timeout=CATCH_UP,
                            what=f"catch-up after kill {lifetime}",
                        )
                    # ... then the stream keeps flowing while we pick a random moment to kill.
                    threading.Event().wait(rng.uniform(0.1, 0.8))
                    assert proc.poll() is None, "the daemon died on its own"
                    at_kill = len(stream.snapshot())
                    os.kill(proc.pid, signal.SIGKILL)
                    assert proc.wait(10) == -signal.SIGKILL
                    kills += 1
                threading.Event().wait(rng.uniform(0.05, 0.3))  # down: the stream goes on
                published_while_down += len(stream.snapshot()) - at_kill
            with daemon_process(env) as proc:
                stream.stop()
                published = stream.snapshot()
                wait_until(lambda: recorded_all(state, published), timeout=CATCH_UP, what="final")
                os.kill(proc.pid, signal.SIGTERM)
                assert proc.wait(20) == 0
        finally:
            stream.stop()

    assert kills >= 5
    assert published_while_down > 0, "no event was published while the daemon was down"
    counts = Counter(event_ids(state))
    missing = [i for i in published if counts[i] == 0]
    doubled = {i: n for i, n in counts.items() if n > 1}
    assert missing == [], f"lost: {missing}"
    assert doubled == {}, f"more than one event line: {doubled}"
    assert set(counts) == set(published), "event lines for ids nobody published"
    assert query(state, "SELECT count(*) FROM inbox") == [(len(published),)]
