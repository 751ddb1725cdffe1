"""The overlap backfill (DESIGN.md section 3) against the bundled ntfy-compatible server: what the
exclusive id cursor cannot see is read back by server time, once, and a backfill owed survives a
crash, a 429 and a dropped poll. Each test is named after the failure it kills."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig

from ..harness import (
    DaemonThread,
    audit_records,
    cursor_row,
    daemon_process,
    env_for,
    event_ids,
    query,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.engines

START = 1_764_000_000.0


class Clock:
    """The emulator's clock (message times, `open`/keepalive times), moved by the test."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def emulator_config(clock: Clock) -> EmulatorConfig:
    """conftest's `emu` on the clock these tests move."""
    return EmulatorConfig(
        keepalive_interval=1.0, clock=clock, delayed_sender_interval=None, request_limit=False
    )


def publish(emu, title: str, **kwargs: object) -> str:  # type: ignore[no-untyped-def]
    event: dict[str, object] = emu.publish("alerts", f"{title} body", title=title, **kwargs)
    return str(event["id"])


def counts(state: Path) -> Counter[str]:
    return Counter(event_ids(state))


def backfill_records(state: Path) -> list[dict[str, object]]:
    return [r for r in audit_records(state) if r["kind"] == "backfill"]


def polls(emu) -> list[str]:  # type: ignore[no-untyped-def]
    """The `since` of every backfill poll (not the gap probe, which asks for one id)."""
    return [
        e["query"]["since"]
        for e in emu.subscribe_log
        if e["query"].get("poll") == "1" and "id" not in e["query"]
    ]


def fast(url: str, state: Path, **overrides: str):  # type: ignore[no-untyped-def]
    return settings_for(url, state, **{"ntfy_cache_settle": "200ms", **overrides})


def test_scheduled_message_delivered_while_daemon_is_down_is_recorded_once(
    emu, clock: Clock, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """X-Delay keeps the row id of its publish time: a cursor inserted after it skips it."""
    config = fast(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        scheduled = publish(emu, "scheduled backup check", delay=60)
        later = publish(emu, "cursor after the scheduling")
        wait_until(lambda: cursor_row(tmp_path) == ("id", later), what="cursor past the schedule")
    clock.now += 61
    assert emu.send_delayed() == [scheduled]  # delivered while nobody listens
    after = publish(emu, "after the delivery")
    with DaemonThread(config):
        wait_until(lambda: counts(tmp_path)[after] == 1, what="live message after restart")
        wait_until(lambda: counts(tmp_path)[scheduled] == 1, what="scheduled message backfilled")
        wait_until(lambda: len(backfill_records(tmp_path)) >= 2, what="second backfill record")
    assert counts(tmp_path)[scheduled] == 1
    assert all(n == 1 for n in counts(tmp_path).values()), counts(tmp_path)
    record = backfill_records(tmp_path)[-1]
    assert record["new"] == 1 and record["polled"] == record["new"] + record["duplicate"]


def test_message_published_in_the_reconnect_window_with_the_cache_lagging_is_recorded_once(
    emu, clock: Clock, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """ntfy publishes live before it writes its cache: a message published while the daemon is
    between connections reaches neither the live stream nor the replay."""
    config = fast(emu.url, tmp_path, ntfy_cache_settle="3s")
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        first = publish(emu, "before")
        wait_until(lambda: cursor_row(tmp_path) == ("id", first), what="id cursor")
    emu.faults.lag_cache_writes()  # written only when released
    in_window = publish(emu, "published between connections")
    with DaemonThread(config) as running:
        emu.wait_for_subscribers(1)
        emu.faults.lag_cache_writes(None)
        live = publish(emu, "live after the reconnect")
        wait_until(lambda: counts(tmp_path)[live] == 1, what="live message")
        assert counts(tmp_path)[in_window] == 0  # the replay did not have it
        emu.faults.release_cache_writes()  # the cache write lands before the backfill polls
        wait_until(lambda: counts(tmp_path)[in_window] == 1, what="lagging message backfilled")
        assert running.daemon is not None
    assert all(n == 1 for n in counts(tmp_path).values()), counts(tmp_path)


def test_reorder_longer_than_reorder_window_but_inside_overlap_then_disconnect_loses_nothing(
    emu, clock: Clock, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The earlier message is held back past the reorder window, the cursor settles on the later
    one, and the connection drops before the earlier one arrives: `since=<later>` never returns
    it. The backfill reaches back `overlap` (30 s) by server time: 29 s back is inside."""
    config = fast(emu.url, tmp_path)
    with DaemonThread(config) as running:
        emu.wait_for_subscribers(1)
        wait_until(lambda: backfill_records(tmp_path), what="first backfill")
        emu.faults.swap_next_live(delay=30.0)  # held back far longer than reorder_window
        stranded = publish(emu, "earlier, delivered late")
        clock.now += 29  # overlap - 1 s
        cursor = publish(emu, "later, delivered first")
        wait_until(lambda: cursor_row(tmp_path) == ("id", cursor), what="cursor on the later one")
        assert counts(tmp_path)[stranded] == 0
        emu.faults.drop_connections()
        wait_until(lambda: counts(tmp_path)[stranded] == 1, what="stranded message backfilled")
        assert running.daemon is not None
    assert all(n == 1 for n in counts(tmp_path).values()), counts(tmp_path)


def test_kill9_before_the_backfill_poll_leaves_it_owed_and_the_next_start_polls_from_it(
    emu, clock: Clock, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Killed after the stream recorded newer events (the cursor moved on) but before the poll:
    the next start polls from the stored T, not from one recomputed from the newer cursor."""
    env = env_for(emu.url, tmp_path, NTFY_CACHE_SETTLE="30s")
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1)
        wait_until(lambda: query(tmp_path, "SELECT backfill_from FROM cursor")[0][0] is not None)
        (owed,) = query(tmp_path, "SELECT backfill_from FROM cursor")[0]
        clock.now += 100
        newer = publish(emu, "recorded, then killed")
        wait_until(lambda: cursor_row(tmp_path) == ("id", newer), what="cursor moved on")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert query(tmp_path, "SELECT backfill_from FROM cursor") == [(owed,)]
    clock.now += 100
    with DaemonThread(fast(emu.url, tmp_path)):
        wait_until(lambda: backfill_records(tmp_path), what="the owed backfill")
    assert polls(emu)[-1] == str(owed)  # not newer's time - overlap
    assert backfill_records(tmp_path)[-1]["since"] == owed
    assert query(tmp_path, "SELECT backfill_from FROM cursor") == [(None,)]


def test_429_before_the_backfill_poll_leaves_it_owed_and_the_next_start_does_it(
    emu, clock: Clock, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    config = settings_for(emu.url, tmp_path, ntfy_cache_settle="500ms")
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        emu.faults.fail_subscribes(1, status=429)  # the poll is the next request
        wait_until(lambda: any(e["status"] == 429 for e in emu.subscribe_log), what="429")
        (owed,) = query(tmp_path, "SELECT backfill_from FROM cursor")[0]
        assert owed is not None
    # Stopped before the retry (backoff >= 2.5 s): still owed.
    assert query(tmp_path, "SELECT backfill_from FROM cursor") == [(owed,)]
    assert backfill_records(tmp_path) == []
    clock.now += 100
    with DaemonThread(config):
        wait_until(lambda: backfill_records(tmp_path), what="the owed backfill")
    assert polls(emu)[-1] == str(owed)
    assert query(tmp_path, "SELECT backfill_from FROM cursor") == [(None,)]


def test_backfill_duplicates_give_no_second_outcome_and_are_counted(emu, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = fast(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        ids = [publish(emu, f"seen live {i}") for i in range(3)]
        wait_until(lambda: all(counts(tmp_path)[i] == 1 for i in ids))
    with DaemonThread(config):
        wait_until(lambda: len(backfill_records(tmp_path)) >= 1, what="backfill on restart")
    assert all(n == 1 for n in counts(tmp_path).values()), counts(tmp_path)
    record = backfill_records(tmp_path)[-1]
    assert (record["new"], record["duplicate"]) == (0, 3)
