"""Intake failure modes against the bundled ntfy-compatible server, over real loopback sockets.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pytest

from ntfy_intake import signal_standin
from ntfy_intake.emulator import EmulatorConfig, NtfyEmulator

from ..harness import (
    DaemonThread,
    cursor_row,
    event_ids,
    notices,
    query,
    settings_for,
    stream_sinces,
    wait_until,
)


@pytest.fixture
def emu():  # type: ignore[no-untyped-def]
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emulator:
        yield emulator


def publish(emu, n: int, prefix: str = "alert") -> list[str]:  # type: ignore[no-untyped-def]
    return [emu.publish("alerts", f"{prefix} {i}", title=f"{prefix} {i}")["id"] for i in range(n)]


def backfills(running: DaemonThread) -> int:
    assert running.daemon is not None
    return running.daemon.counters.extra.get("backfills", 0)


def assert_exactly_once(state: Path, ids: list[str]) -> None:
    counts = Counter(event_ids(state))
    assert {i: counts[i] for i in ids} == dict.fromkeys(ids, 1)
    assert all(c == 1 for c in counts.values()), counts


def test_resume_is_exclusive_and_loses_nothing_across_sigterm_restart(emu, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        first = publish(emu, 5, "before")
        wait_until(lambda: set(first) <= set(event_ids(tmp_path)), what="first batch recorded")
    # A graceful stop leaves an id cursor: the last recorded message.
    assert cursor_row(tmp_path) == ("id", first[-1])
    down = publish(emu, 3, "while-down")
    with DaemonThread(config):
        wait_until(lambda: set(down) <= set(event_ids(tmp_path)), what="backlog recorded")
        live = publish(emu, 2, "after")
        wait_until(lambda: set(live) <= set(event_ids(tmp_path)), what="live recorded")
    assert_exactly_once(tmp_path, first + down + live)
    # Exclusive resume: the restart asked for what came after the cursor, and got no duplicates.
    assert first[-1] in stream_sinces(emu.subscribe_log)
    assert query(tmp_path, "SELECT count(*) FROM inbox") == [(10,)]


def test_forced_400_drops_cursor_and_replays_all_with_zero_double_outcomes(
    emu, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        first = publish(emu, 3)
        wait_until(lambda: set(first) <= set(event_ids(tmp_path)))
    emu.faults.force_400(1)
    with DaemonThread(config) as running:
        wait_until(lambda: notices(tmp_path, "fallback_400"), what="fallback notice")
        later = publish(emu, 2, "later")
        wait_until(lambda: set(later) <= set(event_ids(tmp_path)))
        assert running.daemon is not None and running.daemon.counters.duplicates >= 3
    sinces = stream_sinces(emu.subscribe_log)
    assert sinces[-2:] == [first[-1], "all"], sinces
    assert_exactly_once(tmp_path, first + later)
    assert len(notices(tmp_path, "fallback_400")) == 1
    assert query(tmp_path, "SELECT kind FROM owner_outbox WHERE key LIKE 'fallback_400:%'") == [
        ("notice",)
    ]


def test_evicted_cursor_full_replay_records_nothing_twice_and_reports_gap_window(
    tmp_path: Path,
) -> None:
    # A 1000 s cache on both sides, so that pruning what the test evicts is what ntfy would do.
    clock = {"now": 1_764_000_000.0}
    with NtfyEmulator(
        EmulatorConfig(
            keepalive_interval=1.0,
            clock=lambda: clock["now"],
            cache_duration=1000.0,
            manager_interval=None,
        )
    ).running() as emu:
        config = settings_for(emu.url, tmp_path, ntfy_cache_duration="1000s")
        with DaemonThread(config):
            emu.wait_for_subscribers(1)
            first = publish(emu, 3)
            wait_until(lambda: set(first) <= set(event_ids(tmp_path)))
        last_seen = clock["now"]  # the last frame before the stop carried this server time
        clock["now"] += 600
        lost = emu.publish("alerts", "published while down, then pruned", title="lost")
        clock["now"] += 1200
        kept = emu.publish("alerts", "still held", title="kept")
        emu.faults.evict([*first, lost["id"]])
        with DaemonThread(config):
            wait_until(lambda: kept["id"] in event_ids(tmp_path))
            wait_until(lambda: notices(tmp_path, "gap"), what="gap notice")
    (gap,) = notices(tmp_path, "gap")
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    # From the last frame seen to the first moment whose messages ntfy must still hold (anything
    # younger than its cache duration): the lost message lies inside.
    assert gap["window_start"] == dt.datetime.fromtimestamp(last_seen, dt.UTC).strftime(fmt)
    end = dt.datetime.fromtimestamp(clock["now"] - 1000, dt.UTC).strftime(fmt)
    assert gap["window_end"] == end
    assert gap["window_start"] < dt.datetime.fromtimestamp(lost["time"], dt.UTC).strftime(fmt) < end
    assert lost["id"] not in event_ids(tmp_path)  # truly gone: reported, not invented
    assert_exactly_once(tmp_path, [*first, kept["id"]])


def test_expired_cursor_on_a_connected_quiet_daemon_gives_no_gap_notice(tmp_path: Path) -> None:
    """A homelab with nothing to say for 13 h: its cursor message expired while the daemon was
    connected and hearing keepalives. A reconnect then finds the cursor gone, but nothing can be
    lost: the window starts at the last keepalive, and ntfy still holds everything since."""
    clock = {"now": 1_764_000_000.0}
    with NtfyEmulator(
        EmulatorConfig(keepalive_interval=0.2, clock=lambda: clock["now"], manager_interval=None)
    ).running() as emu:
        config = settings_for(emu.url, tmp_path, ntfy_cache_settle="100ms")
        with DaemonThread(config) as running:
            emu.wait_for_subscribers(1)
            wait_until(lambda: backfills(running) >= 1, what="first backfill")
            (cursor_id,) = publish(emu, 1)
            wait_until(lambda: cursor_row(tmp_path) == ("id", cursor_id), what="id cursor")
            clock["now"] += 13 * 3600  # keepalives go on carrying the server's time
            assert running.daemon is not None
            wait_until(
                lambda: (
                    query(tmp_path, "SELECT last_frame_time FROM cursor") == [(int(clock["now"]),)]
                ),
                what="keepalive time persisted",
            )
            emu.faults.evict([cursor_id])
            emu.faults.drop_connections()
            wait_until(lambda: backfills(running) >= 2, what="second backfill")
    assert notices(tmp_path, "gap") == []
    assert query(tmp_path, "SELECT gap_from, backfill_from FROM cursor") == [(None, None)]


def test_message_delivered_twice_at_subscribe_is_recorded_once(emu, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        first = publish(emu, 2)
        wait_until(lambda: set(first) <= set(event_ids(tmp_path)))
    twice = publish(emu, 1, "twice")
    emu.faults.duplicate_at_subscribe()
    with DaemonThread(config) as running:
        wait_until(lambda: set(twice) <= set(event_ids(tmp_path)))
        wait_until(lambda: running.daemon is not None and running.daemon.counters.duplicates >= 1)
    assert_exactly_once(tmp_path, first + twice)


@pytest.mark.parametrize(
    ("status", "retry_after"), [(503, None), (500, None), (429, 0.3), (401, None), (403, None)]
)
def test_failed_subscribes_keep_the_cursor(
    emu, tmp_path: Path, status: int, retry_after: float | None
) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        first = publish(emu, 2)
        wait_until(lambda: set(first) <= set(event_ids(tmp_path)))
    # Two 401s: a third in a row backs off for 5 minutes (test_three_401s_back_off_five_minutes).
    failures = 2 if status == 401 else 3
    emu.faults.fail_subscribes(failures, status=status, retry_after=retry_after)
    before = len(emu.subscribe_log)
    with DaemonThread(config):
        wait_until(lambda: emu.subscriber_count() >= 1, what="reconnect after failures")
        later = publish(emu, 1, "later")
        wait_until(lambda: set(later) <= set(event_ids(tmp_path)))
    requests = emu.subscribe_log[before:]
    assert [e["status"] for e in requests].count(status) == failures
    # Every stream request, failed or not, carried the same cursor: never `all`, never dropped.
    streams = [e["params"].get("since") for e in requests if not e["params"].get("poll")]
    assert streams and set(streams) == {first[-1]}, streams
    assert_exactly_once(tmp_path, first + later)
    assert notices(tmp_path, "fallback_400") == []


def test_silent_stream_is_dropped_by_the_watchdog_and_keeps_the_cursor(emu, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(
        emu.url, tmp_path, ntfy_keepalive_interval="1s", ntfy_keepalive_timeout="1500ms"
    )
    with DaemonThread(config) as running:
        emu.wait_for_subscribers(1)
        first = publish(emu, 2)
        wait_until(lambda: set(first) <= set(event_ids(tmp_path)))
        wait_until(lambda: cursor_row(tmp_path) == ("id", first[-1]))
        connects = len(stream_sinces(emu.subscribe_log))
        emu.faults.silence(True)
        assert running.daemon is not None
        wait_until(
            lambda: running.daemon.health.watchdog_drops >= 1, timeout=30, what="watchdog drop"
        )
        emu.faults.silence(False)
        wait_until(lambda: running.daemon.health.state == "live", timeout=30)
        later = publish(emu, 1, "later")
        wait_until(lambda: set(later) <= set(event_ids(tmp_path)))
    assert stream_sinces(emu.subscribe_log)[connects:][0] == first[-1]
    assert_exactly_once(tmp_path, first + later)


def test_first_start_crash_before_first_event_loses_nothing(emu, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
    kind, value = cursor_row(tmp_path)
    assert kind == "time"
    down = publish(emu, 2, "while-down")
    with DaemonThread(config):
        wait_until(lambda: set(down) <= set(event_ids(tmp_path)))
    assert stream_sinces(emu.subscribe_log)[-1] == value
    assert_exactly_once(tmp_path, down)


def test_full_audit_disk_latches_cursor_with_one_notice_and_restart_recovers(
    emu, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    if not Path("/dev/full").exists():
        pytest.skip("/dev/full is not available")
    audit_dir = tmp_path / "audit"
    audit_dir.mkdir(mode=0o700)
    day = dt.datetime.now(dt.UTC)
    for offset in (0, 1):
        name = (day + dt.timedelta(days=offset)).strftime("audit-%Y-%m-%d.jsonl")
        (audit_dir / name).symlink_to("/dev/full")  # every audit write fails with ENOSPC
    with signal_standin.running() as sig:
        config = settings_for(
            emu.url,
            tmp_path,
            owner_signal_url=sig.url,
            owner_signal_number="+31600000000",
            owner_recipients="+31600000001",
        )
        with DaemonThread(config) as running:
            emu.wait_for_subscribers(1)
            before = cursor_row(tmp_path)
            ids = publish(emu, 4)
            wait_until(
                lambda: query(tmp_path, "SELECT count(*) FROM inbox") == [(4,)],
                what="recorded in SQLite",
            )
            more = publish(emu, 2, "more")
            wait_until(lambda: query(tmp_path, "SELECT count(*) FROM inbox") == [(6,)])
            assert running.daemon is not None and running.daemon.latched
            assert cursor_row(tmp_path) == before  # frozen
            wait_until(lambda: len(sig.messages()) >= 1, what="the latch notice on Signal")
        assert query(tmp_path, "SELECT count(*) FROM owner_outbox WHERE key LIKE 'latch:%'") == [
            (1,)
        ]
        for link in audit_dir.iterdir():
            link.unlink()  # the disk is freed
        with DaemonThread(config):
            wait_until(lambda: set(ids + more) <= set(event_ids(tmp_path)))
            wait_until(lambda: cursor_row(tmp_path)[0] == "id")
        sent = [m.message for m in sig.messages()]
    assert len(sent) == 1 and "audit log cannot be written" in sent[0], sent
    assert_exactly_once(tmp_path, ids + more)
    assert len(notices(tmp_path, "latch")) == 1
