"""A COMMIT fault at each write of the intake, relay, owner and feed paths, then the retry.

The one rule (`db.Transaction.after_commit`): in-memory state changes only after COMMIT. So a
transaction whose COMMIT failed (an fsync's EIO, waited out by the daemon's `Database.run`, which runs
the same work again) decides from the same memory the second time: no notice, cadence decision,
counter or streak is lost or doubled. Each case is named after the failure it kills, the one
that comes back when that site's mutation moves before COMMIT again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ntfy_intake.errors import StoreError
from ntfy_intake.flow import database, intake, relay
from ntfy_intake.flow.journal import MARK_OWED_AT_MOST
from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.rules import notices
from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import cursor, feed
from ntfy_intake.wire import refusals

from ..conftest import make_message
from ..harness import CommitFaults, audit_records, event_ids, query, settings_for, store_of

pytestmark = pytest.mark.engines


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A recovered daemon whose steps are driven directly; a daily cap of one owner message,
    so a reply decided twice is a reply suppressed."""
    monkeypatch.setattr(database, "STORAGE_RETRY_BASE", 0.001)
    config = settings_for(
        "http://127.0.0.1:9",
        tmp_path,
        cadence_debounce="0s",
        cadence_daily_cap="1",
        relay_url="http://receiver.invalid/triage",
    )
    found = Daemon(config)
    found.recover()
    yield found
    found.close()


def received(*ids: str, read_at: float | None = None) -> list[intake.Received]:
    at = time.monotonic() if read_at is None else read_at
    return [intake.Received(make_message(i), at, 0) for i in ids]


def owner_rows(state: Path, like: str) -> list[tuple[str, str]]:
    return query(state, "SELECT key, state FROM owner_outbox WHERE key LIKE ?", like)


# -- intake ----------------------------------------------------------------------------------------


def batch_cadence_decision(daemon: Daemon, state: Path) -> None:
    asyncio.run(daemon.writer.record(received("aaaaaaaaaaa1")))
    asyncio.run(daemon.writer.record(received("aaaaaaaaaaa2")))  # the same incident, in cooldown
    outcomes = query(state, "SELECT event_id, outcome FROM inbox ORDER BY seq")
    assert outcomes == [("aaaaaaaaaaa1", "triage_requested"), ("aaaaaaaaaaa2", "suppressed")]
    assert query(state, "SELECT delivery_key FROM outbox") == [("tri_aaaaaaaaaaa1",)]
    assert sorted(event_ids(state)) == ["aaaaaaaaaaa1", "aaaaaaaaaaa2"]
    counters = daemon.counters
    assert (counters.recorded, counters.duplicates, counters.batches) == (2, 0, 2)
    assert len(daemon.resume) == 2


def intake_notice(daemon: Daemon, state: Path) -> None:
    refused = refusals.Refused("credentials", 403, 40301, "forbidden", "alerts", "1")
    asyncio.run(daemon.writer.record_refusal(refused))
    assert [s for _, s in owner_rows(state, "subscribe_refused:%")] == ["pending"]
    assert daemon.owner_queue.queued == 1
    assert [r["notice"] for r in audit_records(state) if r["kind"] == "notice"] == [
        "subscribe_refused"
    ]


def fallback_400_notice(daemon: Daemon, state: Path) -> None:
    asyncio.run(daemon.writer.drop_cursor(cursor.Cursor.at_id("aaaaaaaaaaa1", 1), '{"code":40008}'))
    assert query(state, "SELECT kind, value FROM cursor") == [("all", "all")]
    assert [s for _, s in owner_rows(state, "fallback_400:%")] == ["pending"]
    assert daemon.owner_queue.queued == 1
    assert daemon.counters.extra["fallback_400"] == 1


def cursor_move(daemon: Daemon, state: Path) -> None:
    # Read long ago: the reorder window has passed, the cursor may move at once (a drain's).
    asyncio.run(daemon.writer.record(received("aaaaaaaaaaa1", read_at=time.monotonic() - 60)))
    asyncio.run(daemon.writer.settle_cursor(at_once=True))
    assert query(state, "SELECT kind, value FROM cursor") == [("id", "aaaaaaaaaaa1")]
    assert daemon.writer.cursor == cursor.Cursor.at_id("aaaaaaaaaaa1", 1_764_470_000)
    assert daemon.counters.cursor_moves == 1


def owed_cursor_move(daemon: Daemon, state: Path) -> None:
    # Live, the cursor rides the next write: here the ticker's owed one, whose COMMIT fails.
    asyncio.run(daemon.writer.record(received("aaaaaaaaaaa1", read_at=time.monotonic() - 60)))
    asyncio.run(daemon.writer.settle_cursor())
    asyncio.run(daemon.journal.write_owed_mark(time.monotonic() + MARK_OWED_AT_MOST))
    assert query(state, "SELECT kind, value FROM cursor") == [("id", "aaaaaaaaaaa1")]
    assert daemon.writer.cursor == cursor.Cursor.at_id("aaaaaaaaaaa1", 1_764_470_000)
    assert daemon.counters.cursor_moves == 1


# -- relay -----------------------------------------------------------------------------------------


def _relay_run(daemon: Daemon, answers: list[httpx.Response]) -> relay.Relay:
    """One pending request, then one relay turn (claim, POST, settle) per answer."""
    asyncio.run(daemon.writer.record(received("aaaaaaaaaaa1")))
    now = {"t": time.time()}

    async def scenario() -> relay.Relay:
        handler = lambda request: answers.pop(0)  # noqa: E731
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = relay.Relay(
                daemon.conn,
                client,
                run_db=daemon.database.run,
                owner_queue=daemon.owner_queue,
                url="http://receiver.invalid/triage",
                timeout=5.0,
                max_attempts=8,
                clock=lambda: now["t"],
                flush_audit=daemon.journal.flush,
                rng=lambda: 0.0,
                retry_base=0.01,
            )
            while answers:
                assert await r.run_once()
                now["t"] += 1000.0
            return r

    found = asyncio.run(scenario())
    assert answers == []
    return found


def relay_401_notice(daemon: Daemon, state: Path) -> None:
    answers = [httpx.Response(401), httpx.Response(401), httpx.Response(200)]
    r = _relay_run(daemon, answers)
    assert [s for _, s in owner_rows(state, "relay_unauthorized:%")] == ["pending"]
    assert not r.unauthorized_streak  # delivered: the streak is over
    assert (r.stats.retries, r.stats.delivered) == (2, 1)


def relay_dead_row(daemon: Daemon, state: Path) -> None:
    r = _relay_run(daemon, [httpx.Response(400)])
    assert query(state, "SELECT state FROM outbox") == [("dead",)]
    assert [s for _, s in owner_rows(state, "dead_row:%")] == ["pending"]
    assert r.stats.dead == 1
    assert daemon.owner_queue.queued == 1
    results = [r["result"] for r in audit_records(state) if r["kind"] == "delivery"]
    assert results == ["dead"]


def relay_reply_under_the_cap(daemon: Daemon, state: Path) -> None:
    reply = httpx.Response(200, json={"notify": {"text": "nas1 is back"}})
    r = _relay_run(daemon, [reply])
    assert owner_rows(state, "notify:%") == [("notify:tri_aaaaaaaaaaa1", "pending")]
    assert r.stats.delivered == 1
    assert daemon.owner_queue.queued == 1
    assert daemon.owner_queue.state.triage_messages_today(daemon.policy, time.time()) == 1


# -- owner -----------------------------------------------------------------------------------------


def owner_send(daemon: Daemon, state: Path) -> None:
    daemon.journal.record_notice(notices.gap("aaaaaaaaaaa1", "10:00", "10:05"))
    owner = OwnerSettings(
        signal_url="http://signal.invalid",
        signal_number="+31600000000",
        recipients=("+31600000001",),
        fallback_topic=None,
    )

    async def scenario() -> OwnerSender:
        handler = lambda request: httpx.Response(201, json={"timestamp": "1"})  # noqa: E731
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            sender = OwnerSender(
                daemon.conn,
                client,
                run_db=daemon.database.run,
                owner=owner,
                ntfy_url="http://127.0.0.1:9",
                ntfy_token=None,
                clock=time.time,
                flush_audit=daemon.journal.flush,
            )
            assert await sender.run_once()
            return sender

    sender = asyncio.run(scenario())
    assert [s for _, s in owner_rows(state, "gap:%")] == ["sent"]
    assert (sender.stats.attempts, sender.stats.sent_signal) == (1, 1)
    legs = [r["result"] for r in audit_records(state) if r["kind"] == "owner_message"]
    assert legs.count("sent") == 1


def agent_reply_under_the_cap(daemon: Daemon, state: Path) -> None:
    status, body = asyncio.run(daemon.journal.queue_agent_reply("disk replaced", "reply-1"))
    assert (status, body["result"]) == (202, "queued")
    assert owner_rows(state, "agent:%") == [("agent:reply-1", "pending")]
    assert daemon.owner_queue.queued == 1
    assert daemon.owner_queue.state.triage_messages_today(daemon.policy, time.time()) == 1


# -- feed ------------------------------------------------------------------------------------------


def feed_post_doorbell(daemon: Daemon, state: Path) -> None:
    """An agent posts; the COMMIT fails and the agent retries under the same key."""
    with feed.FeedStore.open(store_of(state)) as store:
        with pytest.raises(StoreError):
            store.post(
                "notes", {"text": "looked at it"}, sender="agent", summary="s", idempotency_key="n1"
            )
        assert store.changes() == 0  # no doorbell rings for an entry that is not there
        store.post(
            "notes", {"text": "looked at it"}, sender="agent", summary="s", idempotency_key="n1"
        )
        assert store.changes() == 1
        assert store.head("notes") == 1


@dataclass(frozen=True)
class Site:
    failure: str  # what went wrong when this site's memory moved before COMMIT
    within: str  # the function (qualname) whose transaction's COMMIT fails once
    scenario: Callable[[Daemon, Path], None]
    skip: int = 0  # that function's transactions to let commit first


SITES = [
    Site("batch-cadence-decision-lost", "_record_batch", batch_cadence_decision),
    Site("intake-notice-counted-twice", "Journal.record_notice", intake_notice),
    Site("fallback-400-notice-counted-twice", "Writer._record_drop", fallback_400_notice),
    Site("cursor-move-counted-twice", "save", cursor_move),
    Site("owed-cursor-move-lost-or-counted-twice", "write_owed_mark", owed_cursor_move),
    # The first transaction of `_settle_and_claim` is the claim; the second settles.
    Site("relay-401-notice-lost", "Relay._settle_and_claim", relay_401_notice, skip=1),
    Site("relay-dead-row-counted-twice", "Relay._settle_and_claim", relay_dead_row, skip=1),
    Site(
        "relay-reply-suppressed-by-its-own-cap-count",
        "Relay._settle_and_claim",
        relay_reply_under_the_cap,
        skip=1,
    ),
    Site("owner-send-counted-twice", "OwnerSender._settle", owner_send),
    Site(
        "agent-reply-suppressed-by-its-own-cap-count",
        "Journal._queue_agent_message",
        agent_reply_under_the_cap,
    ),
    Site("feed-doorbell-rung-for-a-rolled-back-post", "FeedStore.post", feed_post_doorbell),
]


@pytest.mark.parametrize("site", SITES, ids=[s.failure for s in SITES])
def test_commit_fault_then_retry_neither_loses_nor_doubles_what_memory_holds(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, site: Site
) -> None:
    faults = CommitFaults(monkeypatch)
    faults.fail_once(site.within, skip=site.skip)

    site.scenario(daemon, tmp_path)

    assert faults.fired == [site.within]  # the fault did happen, where it was meant to
