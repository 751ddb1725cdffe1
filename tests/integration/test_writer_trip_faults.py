"""Faults inside the writer's one trip to the worker thread, and what the trip leaves behind.

Each test is named after the failure it kills (see test_daemon_writer.py for the trip's basics).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.flow import database, intake
from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.runtime.switches import GIL_SWITCH_INTERVAL_S
from ntfy_intake.store import audit, inbox
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..conftest import make_message
from ..harness import DaemonThread, engine_fault, event_ids, query, settings_for, wait_until

pytestmark = pytest.mark.engines


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A recovered daemon whose pipeline steps are driven directly (no ntfy, no tasks)."""
    monkeypatch.setattr(database, "STORAGE_RETRY_BASE", 0.001)
    found = Daemon(settings_for("http://127.0.0.1:9", tmp_path, cadence_debounce="0s"))
    found.recover()
    yield found
    found.close()


def received(*ids: str) -> list[intake.Received]:
    return [intake.Received(make_message(i), time.monotonic(), 0) for i in ids]


def replaced_notices(state: Path) -> list[tuple[str]]:
    return query(state, "SELECT key FROM owner_outbox WHERE key LIKE 'audit_file_replaced:%'")


def test_storage_fault_on_the_replaced_file_notice_does_not_lose_the_notice(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit file was deleted under the daemon; the flush reopened it and the notice's own
    transaction hit a transient fault (the lock held by the feed CLI). The trip ran again, but
    the replacement had already been taken from the audit log: the owner never heard."""
    asyncio.run(daemon.writer.record(received("before000001")))
    for path in audit.log_files(tmp_path / "audit"):
        path.unlink()
    original = daemon.owner_queue.notice
    failures = {"left": 1}

    def notice_failing_once(*args: Any, **kwargs: Any) -> Any:
        if args[1].notice == "audit_file_replaced" and failures["left"]:
            failures["left"] -= 1
            raise engine_fault("locked")
        return original(*args, **kwargs)

    monkeypatch.setattr(daemon.owner_queue, "notice", notice_failing_once)

    asyncio.run(daemon.writer.record(received("after0000001")))

    assert failures["left"] == 0  # the fault did happen
    assert len(replaced_notices(tmp_path)) == 1
    assert daemon.counters.extra["audit_file_replaced"] == 1
    assert sorted(event_ids(tmp_path)) == ["after0000001", "before000001"]


def test_overlapping_daemons_leave_the_switch_interval_as_they_found_it(tmp_path: Path) -> None:
    """Each daemon saved the interval it found and put it back when it stopped: two in one
    process (tests, an embedding program) that stop in the order they started leave 1 ms
    behind for good, and every later thread switch in the process pays for it."""
    found = sys.getswitchinterval()
    assert found != GIL_SWITCH_INTERVAL_S
    first = DaemonThread(settings_for("http://127.0.0.1:9", tmp_path / "one"))
    second = DaemonThread(settings_for("http://127.0.0.1:9", tmp_path / "two"))
    try:
        first.start()
        wait_for(lambda: first.daemon is not None and first.daemon.ready.is_set())
        second.start()
        wait_for(lambda: second.daemon is not None and second.daemon.ready.is_set())
        assert sys.getswitchinterval() == GIL_SWITCH_INTERVAL_S
        first.stop()
        assert sys.getswitchinterval() == GIL_SWITCH_INTERVAL_S  # the second still runs
        second.stop()
    finally:
        first.stop()
        second.stop()
        leaked = sys.getswitchinterval()
        sys.setswitchinterval(found)
    assert leaked == found


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        threading.Event().wait(0.02)


@pytest.mark.parametrize("debounce", ["0s", "60s"])
def test_storage_fault_midway_through_one_by_one_does_not_open_a_second_triage_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, debounce: str
) -> None:
    """A value broke the batch, so its frames were recorded one transaction each; a transient
    fault on the second frame re-ran the whole trip with the cadence state from before the
    first frame's commit. The first frame was then a duplicate that decided nothing, and the
    second opened a second triage request for the same incident (within its cooldown, or
    beside the one collecting its debounce window)."""
    monkeypatch.setattr(database, "STORAGE_RETRY_BASE", 0.001)
    config = settings_for(
        "http://127.0.0.1:9",
        tmp_path,
        cadence_debounce=debounce,
        cadence_cooldown="1h",
        relay_url="http://127.0.0.1:9/hook",
    )
    found = Daemon(config)
    found.recover()
    real = inbox._record_batch
    calls = {"batch": 0, "single": 0}

    def value_fault_then_storage_fault(*args: Any, **kwargs: Any) -> Any:
        frames = args[1]
        key = "batch" if len(frames) > 1 else "single"
        calls[key] += 1
        if key == "batch" and calls[key] == 1:
            raise ValueError("a value the batch cannot take")
        if key == "single" and calls[key] == 2:
            raise engine_fault("locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(inbox, "_record_batch", value_fault_then_storage_fault)
    now = int(time.time())
    try:
        asyncio.run(
            found.writer.record(
                [
                    intake.Received(make_message(i, time=now), time.monotonic(), 0)
                    for i in ("sameinc00001", "sameinc00002")
                ]
            )
        )
    finally:
        found.close()
    assert calls == {"batch": 2, "single": 2}  # both faults happened
    assert query(tmp_path, "SELECT count(*) FROM outbox") == [(1,)]


def test_stop_while_a_batch_is_in_the_worker_thread_loses_and_doubles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (a graceful stop) lands while the writer's trip is in the worker thread (a slow
    fsync): the drain must wait for it, the lock must not be handed on mid-trip, and a restart
    must find one event line per id, whatever was committed or flushed when the stop came."""
    state = tmp_path / "state"
    real_flush = audit.flush
    in_trip = threading.Event()

    def slow_flush(*args: Any, **kwargs: Any) -> int:
        in_trip.set()
        time.sleep(0.3)
        return real_flush(*args, **kwargs)

    monkeypatch.setattr(audit, "flush", slow_flush)
    config = EmulatorConfig(keepalive_interval=1.0, request_limit=False)
    with NtfyEmulator(config).running() as emu:
        settings = settings_for(emu.url, state, ntfy_cache_settle="100ms")
        with DaemonThread(settings) as running:
            emu.wait_for_subscribers(1)
            in_trip.clear()
            ids = [str(emu.publish("alerts", f"in flight {n}")["id"]) for n in range(5)]
            assert in_trip.wait(10)
            running.stop()  # while the trip sleeps in the worker thread
            assert running.daemon is not None and not running.daemon.failed
        monkeypatch.setattr(audit, "flush", real_flush)
        with DaemonThread(settings):
            emu.wait_for_subscribers(1)
            later = str(emu.publish("alerts", "after the restart")["id"])
            wait_until(lambda: later in event_ids(state), what="the restart records")
            wait_until(lambda: set(ids) <= set(event_ids(state)), what="nothing lost")
    assert Counter(event_ids(state)) == Counter(dict.fromkeys([*ids, later], 1))
