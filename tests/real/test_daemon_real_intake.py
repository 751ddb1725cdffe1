"""The daemon against the real ntfy server (v2.13): the ways an id cursor alone loses a message
there (ntfy-spec.md section 10), each named after the failure it kills. Scheduled-message tests
wait for ntfy's delayed sender (10 s minimum delay, checked every 10 s): they are few."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from ntfy_intake.store import db

from ..harness import (
    DaemonThread,
    audit_records,
    cursor_row,
    daemon_process,
    env_for,
    event_ids,
    notices,
    query,
    settings_for,
    wait_until,
)
from ..real_ntfy import RealNtfy

pytestmark = [pytest.mark.real_ntfy, pytest.mark.engines]


def settings(server: RealNtfy, state: Path, **overrides: str):  # type: ignore[no-untyped-def]
    # ntfy refuses a keepalive interval under 5 s; the watchdog must not drop a quiet stream.
    return settings_for(server.url, state, **{"ntfy_keepalive_interval": "5s", **overrides})


def held(server: RealNtfy, event_id: str) -> bool:
    """Whether ntfy returns the message to a poll (cached and published)."""
    text = httpx.get(f"{server.url}/alerts/json", params={"poll": "1"}, timeout=10).text
    return event_id in text


def connected(running: DaemonThread) -> bool:
    return running.daemon is not None and running.daemon.health.connections >= 1


def backfill_epoch(state: Path) -> int:
    return int(query(state, "SELECT backfill_epoch FROM cursor")[0][0])


def backfills(state: Path) -> list[dict[str, object]]:
    return [r for r in audit_records(state) if r["kind"] == "backfill"]


def test_scheduled_message_delivered_while_the_daemon_is_down_is_recorded_once(
    make_real_ntfy: Callable[..., RealNtfy], tmp_path: Path
) -> None:
    """ntfy inserts an X-Delay message at publish time and publishes it at delivery: a cursor
    inserted after the scheduling never returns it with `since=<id>`."""
    server = make_real_ntfy()
    config = settings(server, tmp_path, ntfy_cache_settle="500ms")
    with DaemonThread(config):
        wait_until(lambda: backfills(tmp_path), what="connected")
        scheduled = server.publish("alerts", "nightly scrub result", Title="scrub", X_Delay="10s")
        cursor = server.publish("alerts", "published after the scheduling", Title="later")
        wait_until(lambda: cursor_row(tmp_path) == ("id", cursor["id"]), what="id cursor")
    wait_until(lambda: held(server, scheduled["id"]), timeout=40, what="delayed delivery")
    after = server.publish("alerts", "after the delivery", Title="after")
    with DaemonThread(config):
        wait_until(lambda: after["id"] in event_ids(tmp_path), what="after recorded")
        wait_until(lambda: scheduled["id"] in event_ids(tmp_path), what="scheduled recorded")
    counts = Counter(event_ids(tmp_path))
    assert counts[scheduled["id"]] == 1 and all(n == 1 for n in counts.values()), counts
    # The stream resumed after the cursor and could not have returned it: the backfill did.
    assert backfills(tmp_path)[-1]["new"] >= 1


def test_message_published_in_the_reconnect_window_with_ntfy_batching_cache_writes_is_recorded_once(
    make_real_ntfy: Callable[..., RealNtfy], tmp_path: Path
) -> None:
    """With cache batching (ntfy.sh writes every 1 s), a message published while the daemon is
    between connections is in neither the live stream (nobody subscribed) nor the replay (not
    written yet); later live messages then move the cursor past it."""
    server = make_real_ntfy(extra={"cache-batch-size": 1000, "cache-batch-timeout": "5s"})
    config = settings(server, tmp_path, ntfy_cache_settle="6s")
    with DaemonThread(config) as running:
        wait_until(lambda: connected(running), what="connected")
        first = server.publish("alerts", "before", Title="before")
        wait_until(lambda: cursor_row(tmp_path) == ("id", first["id"]), what="id cursor")
        # Wait for the batch write that holds it: the next one comes 5 s later.
        wait_until(lambda: held(server, first["id"]), timeout=15, what="first batch written")
    written_at = time.monotonic()
    in_window = server.publish("alerts", "between connections", Title="in window")
    with DaemonThread(config) as running:
        wait_until(lambda: connected(running), what="connected again")
        assert time.monotonic() - written_at < 4, "too slow to land inside the batch window"
        live = server.publish("alerts", "live after the reconnect", Title="live")
        wait_until(lambda: live["id"] in event_ids(tmp_path), what="live recorded")
        wait_until(lambda: in_window["id"] in event_ids(tmp_path), what="in-window recorded")
    counts = Counter(event_ids(tmp_path))
    assert counts[in_window["id"]] == 1 and all(n == 1 for n in counts.values()), counts
    assert backfills(tmp_path)[-1]["new"] == 1  # it came from the backfill, not the replay


def _cursor_if_any(state: Path) -> tuple[str, str] | None:
    """The cursor row, or None while the daemon has not made its store or written it yet (a
    read racing start-up: the table may not exist, or hold no row)."""
    try:
        return cursor_row(state)
    except (*db.ERRORS, ValueError):
        return None


def test_40009_keeps_the_cursor_and_tells_the_owner_once_with_ntfys_text(
    make_real_ntfy: Callable[..., RealNtfy], tmp_path: Path
) -> None:
    """A subscribe over ntfy's global topic limit gets 400 code 40009 (ntfy-spec.md 1.2): it
    has nothing to do with the cursor, which must survive it."""
    server = make_real_ntfy(extra={"global-topic-limit": 1})
    with DaemonThread(settings(server, tmp_path, ntfy_topics="alerts")):
        sent = server.publish("alerts", "disk full", Title="disk")
        wait_until(lambda: _cursor_if_any(tmp_path) == ("id", sent["id"]), what="id cursor")
    with DaemonThread(settings(server, tmp_path)) as running:  # alerts,backups: one too many
        assert running.daemon is not None
        health = running.daemon.health
        wait_until(lambda: health.failures.get("http_400", 0) >= 2, what="two refusals")
        wait_until(lambda: notices(tmp_path, "subscribe_refused"), what="notice")
    assert cursor_row(tmp_path) == ("id", sent["id"])
    assert notices(tmp_path, "fallback_400") == []
    (notice,) = notices(tmp_path, "subscribe_refused")
    assert notice["category"] == "rejected" and notice["topics"] == "alerts,backups"
    assert "40009: invalid request: topic invalid" in str(notice["text"])


def test_kill9_before_the_backfill_poll_leaves_it_owed_and_the_next_start_polls_from_it(
    make_real_ntfy: Callable[..., RealNtfy], tmp_path: Path
) -> None:
    """A scheduled message delivered while the daemon is down, then a start that is killed after
    its stream moved the cursor well past it but before its backfill poll: the next start must
    poll from the T stored at that open, not from one recomputed from the newer cursor (which
    would start after the scheduled message's time)."""
    server = make_real_ntfy()
    overlap = {"ntfy_overlap": "11s"}  # the least allowed (reorder_window 300ms + 10 s)
    with DaemonThread(settings(server, tmp_path, ntfy_cache_settle="500ms", **overlap)):
        wait_until(lambda: backfills(tmp_path), what="connected")
        scheduled = server.publish("alerts", "scrub result", Title="scrub", X_Delay="10s")
        cursor = server.publish("alerts", "after the scheduling", Title="later")
        wait_until(lambda: cursor_row(tmp_path) == ("id", cursor["id"]), what="id cursor")
    wait_until(lambda: held(server, scheduled["id"]), timeout=40, what="delayed delivery")
    env = env_for(
        server.url,
        tmp_path,
        NTFY_KEEPALIVE_INTERVAL="5s",
        NTFY_CACHE_SETTLE="60s",  # killed long before its poll
        NTFY_OVERLAP="11s",
    )
    with daemon_process(env) as proc:
        wait_until(lambda: backfill_epoch(tmp_path) >= 2, what="second connection opened")
        opened = time.monotonic()
        (owed,) = query(tmp_path, "SELECT backfill_from FROM cursor")[0]
        time.sleep(max(0.0, opened + 13 - time.monotonic()))  # beyond the overlap
        newer = server.publish("alerts", "recorded by the killed daemon", Title="newer")
        wait_until(lambda: cursor_row(tmp_path) == ("id", newer["id"]), what="cursor moved on")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert newer["time"] - 11 > scheduled["time"]  # a recomputed T would miss it
    assert query(tmp_path, "SELECT backfill_from FROM cursor") == [(owed,)]
    with DaemonThread(settings(server, tmp_path, ntfy_cache_settle="500ms", **overlap)):
        wait_until(lambda: scheduled["id"] in event_ids(tmp_path), what="scheduled recorded")
    counts = Counter(event_ids(tmp_path))
    assert counts[scheduled["id"]] == 1 and all(n == 1 for n in counts.values()), counts
    assert backfills(tmp_path)[-1]["since"] == owed
