"""Intake failure modes against the bundled ntfy-compatible server, over real loopback sockets.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import (
    DaemonThread,
    audit_records,
    cursor_row,
    event_ids,
    notices,
    query,
    settings_for,
    stream_sinces,
    wait_until,
)

pytestmark = pytest.mark.engines


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


@pytest.mark.one_engine(
    "intake's answer to a refused subscribe; the cursor's store has its own tests"
)
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


@pytest.mark.one_engine("the keepalive watchdog on the wire")
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


# -- refusals: only 40008 concerns the cursor; the owner hears once per episode, told which -------


def refused(state: Path) -> list[dict[str, object]]:
    return notices(state, "subscribe_refused")


@pytest.mark.one_engine("intake's answer to a refused subscribe")
def test_400_other_than_40008_keeps_the_cursor_with_one_notice_quoting_ntfy(
    emu, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """40009 (topic not allowed, too many topics) has nothing to do with the cursor: dropping it
    would send a misleading notice and replay the whole cache."""
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        first = publish(emu, 2)
        wait_until(lambda: cursor_row(tmp_path) == ("id", first[-1]))
    emu.faults.fail_subscribes(3, status=400)  # ntfy's generic 40000 "invalid request"
    before = len(emu.subscribe_log)
    with DaemonThread(config):
        wait_until(lambda: emu.subscriber_count() >= 1, what="reconnect after the 400s")
        later = publish(emu, 1, "later")
        wait_until(lambda: set(later) <= set(event_ids(tmp_path)))
    streams = stream_sinces(emu.subscribe_log[before:])
    assert set(streams) == {first[-1]}, streams  # never `all`
    assert notices(tmp_path, "fallback_400") == []
    (notice,) = refused(tmp_path)
    assert notice["category"] == "rejected" and notice["topics"] == "alerts,backups"
    assert "40000: invalid request" in str(notice["text"])
    assert_exactly_once(tmp_path, first + later)


@pytest.mark.one_engine("intake's answer to a refused subscribe")
def test_three_401s_in_a_row_back_off_at_least_five_minutes_with_one_credentials_notice(
    emu, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """ntfy locks the whole IP out after 30 failed authentications (one back a minute)."""
    emu.faults.fail_subscribes(3, status=401)
    with DaemonThread(settings_for(emu.url, tmp_path)) as running:
        assert running.daemon is not None
        health = running.daemon.health
        wait_until(lambda: health.failures.get("http_401", 0) == 3, what="three 401s")
        wait_until(lambda: health.state == "backoff", what="backoff")
        assert health.next_attempt_due is not None
        assert health.next_attempt_due - time.monotonic() >= 290
        wait_until(lambda: refused(tmp_path), what="notice")
    (notice,) = refused(tmp_path)
    assert notice["category"] == "credentials" and "40101: unauthorized" in str(notice["text"])


@pytest.mark.one_engine("intake's answer to a refused subscribe")
def test_403_spends_no_authentication_budget_and_is_noticed_as_acl(emu, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    emu.faults.fail_subscribes(4, status=403)
    with DaemonThread(settings_for(emu.url, tmp_path)) as running:
        wait_until(lambda: emu.subscriber_count() >= 1, what="connected after four 403s")
        assert running.daemon is not None
        # Four subscribes refused, the per-topic probes among them (a multi-topic 403 is probed
        # topic by topic: test_forbidden_topic.py); none of them waited out an auth backoff.
        assert [e["status"] for e in emu.subscribe_log].count(403) == 4
        wait_until(lambda: refused(tmp_path), what="notice")
    (notice,) = refused(tmp_path)
    assert notice["category"] == "acl" and "40301: forbidden" in str(notice["text"])


@pytest.mark.one_engine("intake's answer to a refused subscribe")
def test_rate_limit_is_noticed_once_per_episode_as_rate_limit(emu, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    emu.faults.fail_subscribes(3, status=429)
    with DaemonThread(settings_for(emu.url, tmp_path)):
        wait_until(lambda: emu.subscriber_count() >= 1, what="connected after the 429s")
        wait_until(lambda: refused(tmp_path), what="notice")
        emu.faults.fail_subscribes(1, status=429)  # a new episode after a live connection
        emu.faults.drop_connections()
        wait_until(lambda: len(refused(tmp_path)) == 2, what="second episode's notice")
        wait_until(lambda: emu.subscriber_count() >= 1, what="connected again")
    assert [n["category"] for n in refused(tmp_path)] == ["rate_limit", "rate_limit"]
    assert len({n["key"] for n in refused(tmp_path)}) == 2


# -- ntfy >= 2.16: message_delete, message_clear, updates, and kinds nobody knows yet -------------


def inbox_row(state: Path, event_id: str) -> tuple[object, ...]:
    (row,) = query(
        state,
        "SELECT event, incident_key, outcome, sequence_id FROM inbox WHERE event_id = ?",
        event_id,
    )
    return row


def test_delete_and_clear_get_one_outcome_each_link_to_their_incident_and_cancel_nothing(
    emu, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A person dismissing a notification must never silence triage."""
    config = settings_for(emu.url, tmp_path, cadence_debounce="2s")
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        original = emu.publish("alerts", "raid degraded", title="NAS RAID")["id"]
        httpx.put(f"{emu.url}/alerts/{original}/clear").raise_for_status()
        httpx.delete(f"{emu.url}/alerts/{original}").raise_for_status()
        wait_until(lambda: len(event_ids(tmp_path)) == 3, what="three outcomes")
        wait_until(
            lambda: query(tmp_path, "SELECT state FROM outbox") == [("skipped",)],
            what="the triage request released",
        )
    records = {r["event_id"]: r for r in audit_records(tmp_path) if r["kind"] == "event"}
    actions = [i for i in records if i != original]
    assert sorted(records[i]["event"] for i in actions) == ["message_clear", "message_delete"]
    incident = records[original]["incident"]
    for action in actions:
        assert records[action]["outcome"] == "noted" and records[action]["incident"] == incident
        assert inbox_row(tmp_path, action)[1:] == (incident, "noted", original)
    assert query(tmp_path, "SELECT status FROM incidents") == [("firing",)]
    ((payload,),) = query(tmp_path, "SELECT payload FROM feed_entries")
    body = json.loads(payload)
    assert [e["id"] for e in body["events"]] == [original]
    assert sorted(a["event"] for a in body["device_actions"]) == ["message_clear", "message_delete"]
    assert all(a["sequence_id"] == original for a in body["device_actions"])
    assert_exactly_once(tmp_path, [original, *actions])


def test_delete_after_the_request_went_out_reaches_the_agent_as_information(
    emu, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(emu.url, tmp_path, cadence_debounce="0s")
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        original = emu.publish("alerts", "raid degraded", title="NAS RAID")["id"]
        wait_until(lambda: query(tmp_path, "SELECT state FROM outbox") == [("skipped",)])
        httpx.delete(f"{emu.url}/alerts/{original}").raise_for_status()
        wait_until(lambda: len(event_ids(tmp_path)) == 2, what="the delete's outcome")
    (key,) = query(tmp_path, "SELECT delivery_key FROM outbox")[0]
    ((payload,),) = query(
        tmp_path, "SELECT payload FROM feed_entries WHERE channel = 'incident_info'"
    )
    note = json.loads(payload)
    assert note["schema"] == "ntfy-intake.device-action/1" and note["event"] == "message_delete"
    assert (note["sequence_id"], note["delivery_key"]) == (original, key)
    assert query(tmp_path, "SELECT state FROM outbox") == [("skipped",)]  # nothing cancelled


def test_delete_that_arrives_before_its_original_is_linked_when_the_original_comes(
    emu, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(emu.url, tmp_path)
    original = {
        "id": "origAAAAAAAA",
        "time": 1_764_470_000,
        "expires": 1_764_513_200,
        "event": "message",
        "topic": "alerts",
        "title": "UPS on battery",
        "message": "mains lost",
    }
    delete = {
        "id": "deleteBBBBBB",
        "sequence_id": "origAAAAAAAA",
        "time": 1_764_470_001,
        "expires": 1_764_513_201,
        "event": "message_delete",
        "topic": "alerts",
    }
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        emu.faults.inject_raw((json.dumps(delete) + "\n").encode())
        wait_until(lambda: "deleteBBBBBB" in event_ids(tmp_path))
        assert inbox_row(tmp_path, "deleteBBBBBB") == (
            "message_delete",
            "",
            "noted",
            "origAAAAAAAA",
        )
        emu.faults.inject_raw((json.dumps(original) + "\n").encode())
        wait_until(lambda: "origAAAAAAAA" in event_ids(tmp_path))
    incident = inbox_row(tmp_path, "origAAAAAAAA")[1]
    assert incident == "alerts:ups on battery"
    assert inbox_row(tmp_path, "deleteBBBBBB") == (
        "message_delete",
        incident,
        "noted",
        "origAAAAAAAA",
    )
    assert query(tmp_path, "SELECT count(*) FROM outbox") == [(1,)]  # triage still requested


def test_update_with_a_new_title_joins_the_incident_of_the_message_it_updates(
    emu, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        original = emu.publish("alerts", "backup 10% done", title="Backup running")["id"]
        update = emu.publish(
            "alerts", "backup failed", title="Backup FAILED", sequence_id=original
        )["id"]
        wait_until(lambda: {original, update} <= set(event_ids(tmp_path)))
    assert inbox_row(tmp_path, update)[1] == inbox_row(tmp_path, original)[1]
    assert inbox_row(tmp_path, update)[3] == original
    assert query(tmp_path, "SELECT count(*) FROM incidents") == [(1,)]


def test_unknown_event_kind_is_ignored_with_one_line_never_junk_never_a_crash(
    emu, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    future = {
        "id": "futureCCCCCC",
        "time": 1_764_470_000,
        "event": "message_pin",
        "topic": "alerts",
    }
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        emu.faults.inject_raw((json.dumps(future) + "\n").encode() * 2)  # replayed: still one
        after = publish(emu, 1, "after")
        wait_until(lambda: set(after) <= set(event_ids(tmp_path)))
    lines = [r for r in audit_records(tmp_path) if r.get("event_id") == "futureCCCCCC"]
    assert len(lines) == 1
    assert (lines[0]["outcome"], lines[0]["event"]) == ("ignored", "message_pin")
    assert query(tmp_path, "SELECT count(*) FROM quarantine") == [(0,)]
    assert query(tmp_path, "SELECT count(*) FROM outbox") == [(1,)]  # only `after`


def test_cursor_on_a_delete_event_is_not_mistaken_for_an_evicted_one(emu, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """ntfy >= 2.16 caches deletes and clears: one can be the cursor, and the gap probe must
    recognise it instead of reporting the cursor gone."""
    config = settings_for(emu.url, tmp_path, ntfy_cache_settle="100ms")
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        original = emu.publish("alerts", "raid degraded", title="NAS RAID")["id"]
        httpx.delete(f"{emu.url}/alerts/{original}").raise_for_status()
        wait_until(lambda: len(event_ids(tmp_path)) == 2)
        (delete,) = [i for i in event_ids(tmp_path) if i != original]
        wait_until(lambda: cursor_row(tmp_path) == ("id", delete), what="cursor on the delete")
    # Resume and hold the backfill back: a cursor judged gone would be persisted as a gap owed.
    with DaemonThread(settings_for(emu.url, tmp_path, ntfy_cache_settle="60s")):
        wait_until(
            lambda: query(tmp_path, "SELECT backfill_epoch FROM cursor")[0][0] >= 2,
            what="the resumed connection opened",
        )
        assert query(tmp_path, "SELECT gap_from FROM cursor") == [(None,)]
    probes = [e for e in emu.subscribe_log if e["query"].get("id") == delete]
    assert probes and stream_sinces(emu.subscribe_log)[-1] == delete
