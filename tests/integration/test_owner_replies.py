"""Replies from the owner's phone over Signal (DESIGN.md section 13), in process: the
signal-cli-rest-api stand-in on a real socket, its receive API read by the reply loop, the
owner sender storing the timestamps replies quote, both engines. Time is injected.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.flow.owner_replies import OwnerReplies
from ntfy_intake.rules import cadence
from ntfy_intake.rules.owner_replies import CONFIRM_LIMIT, CONFIRM_WINDOW
from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import audit, db, outbox
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.testbed.signal_standin import SignalHandle

from ..owner_bed import OWNER, SENDER, Clock
from . import conftest

pytestmark = pytest.mark.engines


def __getattr__(name: str) -> object:
    """`conn`, `shared_signal` and `signal` moved to conftest.py; a module that still imports
    them from here (test_owner_replies_escalation.py) gets the same fixtures."""
    if name in ("conn", "shared_signal", "signal"):
        return getattr(conftest, name)
    raise AttributeError(name)


STRANGER = "+31699999999"
T0 = 1_764_470_000.0


def incident(
    conn: db.Connection, key: str, severity: int = 4, status: str = "firing", version: int = 1
) -> None:
    """The incident row as the writer leaves it: `version` goes up when the severity rises or
    the status flips (rules/incidents.merge), not on every event."""
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO incidents(key, severity, status, status_time, status_event, first_seen,"
            " last_seen, events, version) VALUES (?, ?, ?, 1, 'e1', 1, 1, 1, ?)"
            " ON CONFLICT (key) DO UPDATE SET severity = excluded.severity,"
            " status = excluded.status, version = excluded.version",
            (key, severity, status, version),
        )


def request(conn: db.Connection, delivery_key: str, incident_key: str) -> None:
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO outbox(delivery_key, incident_key, reason, state, due_at, created_at)"
            " VALUES (?, ?, 'new_incident', 'delivered', 0, 0)",
            (delivery_key, incident_key),
        )


class World:
    """One store, one owner queue, the sender and the reply loop on an injected clock."""

    def __init__(self, conn: db.Connection, tmp_path: Path, signal: SignalHandle) -> None:
        self.conn = conn
        self.tmp_path = tmp_path
        self.signal = signal
        self.clock = Clock(T0)
        self.queue = OwnerQueue(cadence.Policy(), cadence.CadenceState.empty(cadence.Policy()))
        self.owner = OwnerSettings(
            signal_url=signal.url,
            signal_number=SENDER,
            recipients=(OWNER,),
            fallback_topic=None,
            receive="poll",
        )

    def message(self, delivery_key: str, incident_key: str) -> str:
        """A triage reply about an incident, decided by the cadence: 'queued' or 'suppressed'."""
        request(self.conn, delivery_key, incident_key)
        with db.write_txn(self.conn) as txn:
            result, _ = self.queue.triage_message(
                txn, f"notify:{delivery_key}", f"about {incident_key}", self.clock()
            )
        return result

    def reason(self, key: str) -> str | None:
        row = self.conn.execute("SELECT last_error FROM owner_outbox WHERE key = ?", (key,))
        found = row.fetchone()
        return None if found is None else found[0]

    def run(self, scenario: Callable[[OwnerSender, OwnerReplies], Awaitable[None]]) -> None:
        async def main() -> None:
            with audit.AuditLog(self.tmp_path / "audit", lambda: T0) as log:

                async def flush() -> bool:
                    audit.flush(self.conn, log)
                    return True

                async with httpx.AsyncClient() as client:
                    sender = OwnerSender(
                        self.conn,
                        client,
                        run_db=db.run_inline,
                        owner=self.owner,
                        ntfy_url="",
                        ntfy_token=None,
                        clock=self.clock,
                        flush_audit=flush,
                        timeout=2.0,
                        rng=lambda: 0.0,
                    )
                    replies = OwnerReplies(
                        self.conn,
                        client,
                        run_db=db.run_inline,
                        owner=self.owner,
                        queue=self.queue,
                        clock=self.clock,
                        flush_audit=flush,
                        wake_sender=sender.wakeup.set,
                        status_line=lambda: "healthy: intake live",
                        timeout=2.0,
                    )
                    await scenario(sender, replies)

        asyncio.run(main())

    def records(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in audit.read_records(self.tmp_path / "audit") if r["kind"] == kind]

    def sent_to_owner(self) -> list[str]:
        return [m.message for m in self.signal.messages()]


@pytest.fixture
def world(conn: db.Connection, tmp_path: Path, signal: SignalHandle) -> World:
    incident(conn, "alerts:disk")
    incident(conn, "alerts:cpu")
    return World(conn, tmp_path, signal)


def test_quoted_ack_stops_later_messages_for_that_incident_but_not_others(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    assert world.message("c1", "alerts:cpu") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        disk = next(m for m in world.signal.messages() if "alerts:disk" in m.message)
        # The owner swipes the disk message and types "Ack"; then a newer cpu message is the
        # newest, so only the quote can point at disk.
        world.signal.inbox.inject(SENDER, OWNER, "Ack", quote=disk.timestamp)
        assert await replies.run_once() == 1
        await sender.run_once()  # the confirmation

    world.run(scenario)
    assert world.message("d2", "alerts:disk") == "suppressed"
    assert world.reason("notify:d2") == "acknowledged"
    assert world.message("c2", "alerts:cpu") == "queued"
    [reply] = world.records("owner_reply")
    assert (reply["command"], reply["result"], reply["incident"], reply["matched"]) == (
        "ack",
        "acknowledged",
        "alerts:disk",
        "quote",
    )
    assert "Ack" not in str(reply) and OWNER not in str(reply)
    assert any(m.startswith("Acknowledged alerts:disk") for m in world.sent_to_owner())
    # Its severity rises: the ack ends, the owner hears again.
    incident(world.conn, "alerts:disk", severity=5, version=2)
    assert world.message("d3", "alerts:disk") == "queued"


def test_ack_does_not_hold_once_the_incident_resolved_and_fired_again(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        world.signal.inbox.inject(SENDER, OWNER, "ack")  # no quote: the newest of the hour
        assert await replies.run_once() == 1

    world.run(scenario)
    assert world.message("d2", "alerts:disk") == "suppressed"  # more events, same episode
    incident(world.conn, "alerts:disk", status="resolved", version=2)
    assert world.message("d3", "alerts:disk") == "suppressed"  # the resolution: still acked
    incident(world.conn, "alerts:disk", status="firing", version=3)
    assert world.message("d4", "alerts:disk") == "queued"
    incident(world.conn, "alerts:disk", status="resolved", version=4)
    assert world.message("d5", "alerts:disk") == "queued"  # the old ack never comes back


def test_strangers_ack_is_refused_audited_and_changes_nothing(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        [sent] = world.signal.messages()
        world.signal.inbox.inject(SENDER, STRANGER, "ack secret-words", quote=sent.timestamp)
        assert await replies.run_once() == 1
        await sender.run_once()

    world.run(scenario)
    [refused] = world.records("owner_reply")
    assert refused["result"] == "refused" and refused["source"] == STRANGER
    assert "secret-words" not in str(refused) and "command" not in refused
    assert world.message("d2", "alerts:disk") == "queued"
    assert len(world.signal.messages()) == 1  # no confirmation to anyone


def test_one_envelope_delivered_twice_has_one_effect(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        item = world.signal.inbox.inject(SENDER, OWNER, "silence 2h")
        world.signal.inbox.put(SENDER, item)  # the server hands the same envelope out again
        assert await replies.run_once() == 1
        world.signal.inbox.put(SENDER, item)  # and once more, on a later receive
        assert await replies.run_once() == 0
        await sender.run_once()

    world.run(scenario)
    assert len(world.records("silence")) == 1
    assert len(world.records("owner_reply")) == 1
    assert sum(m.startswith("Silenced alerts:disk") for m in world.sent_to_owner()) == 1
    assert world.message("d2", "alerts:disk") == "suppressed"
    assert world.reason("notify:d2") == "silenced"


def test_silence_from_a_reply_holds_and_unsilence_ends_it(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        [sent] = world.signal.messages()
        world.signal.inbox.inject(SENDER, OWNER, "SILENCE 2h", quote=sent.timestamp)
        await replies.run_once()
        world.clock.t += 3600
        assert world.message("d2", "alerts:disk") == "suppressed"
        world.signal.inbox.inject(SENDER, OWNER, "unsilence", quote=sent.timestamp)
        await replies.run_once()

    world.run(scenario)
    [made] = world.records("silence")
    assert (made["scope"], made["target"]) == ("incident", "alerts:disk")
    assert len(world.records("silence_end")) == 1
    assert world.message("d3", "alerts:disk") == "queued"


def test_unquoted_reply_with_no_recent_message_gets_help_not_a_guess(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        world.clock.t += 2 * 3600  # the message is older than an hour
        world.signal.inbox.inject(SENDER, OWNER, "ack")
        world.signal.inbox.inject(SENDER, OWNER, "ack", quote=123)  # not one of ours
        world.signal.inbox.inject(SENDER, OWNER, "reboot it")
        await replies.run_once()
        await sender.run_once()

    world.run(scenario)
    assert [r["result"] for r in world.records("owner_reply")] == ["unmatched"] * 2 + ["help"]
    assert world.message("d2", "alerts:disk") == "queued"
    helps = [m for m in world.sent_to_owner() if "Reply to one of my messages" in m]
    assert len(helps) == 3


def test_replies_and_confirmations_do_not_count_against_the_daily_cap(world: World) -> None:
    world.queue = OwnerQueue(
        cadence.Policy(daily_cap=2), cadence.CadenceState.empty(cadence.Policy())
    )
    assert world.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        for word in ("status", "help", "details", "status"):
            world.signal.inbox.inject(SENDER, OWNER, word)
        assert await replies.run_once() == 4
        await sender.run_once()

    world.run(scenario)
    assert world.message("c1", "alerts:cpu") == "queued"  # the cap's second slot is still free
    assert "healthy: intake live" in world.sent_to_owner()


def test_failed_receive_changes_nothing_and_is_retried(world: World) -> None:
    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        world.signal.inbox.inject(SENDER, OWNER, "status")
        world.signal.faults.down()
        assert await replies.run_once() == 0
        assert replies.stats.last_error == "ValueError: HTTP 503"
        world.signal.faults.down(False)
        assert await replies.run_once() == 1
        assert replies.stats.last_ok == world.clock.t

    world.run(scenario)


def notice_rows(world: World) -> list[tuple[str, str | None]]:
    rows = world.conn.execute(
        "SELECT key, channel FROM owner_outbox WHERE topic = 'reply_path_dead' ORDER BY key"
    )
    return [(str(r[0]), r[1]) for r in rows.fetchall()]


def test_reply_path_down_past_its_limit_gives_one_notice_through_the_fallback_topic(
    world: World,
) -> None:
    """Failure mode: receiving fails for days and nobody knows that acks go unread."""
    world.owner = OwnerSettings(
        signal_url=world.signal.url,
        signal_number=SENDER,
        recipients=(OWNER,),
        fallback_topic="owner-notices",
        receive="poll",
        receive_dead_after=600.0,
    )

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        world.signal.faults.down()
        await replies.run_once()
        world.clock.t += 599
        await replies.run_once()
        assert notice_rows(world) == []  # not yet past the limit
        world.clock.t += 2
        await replies.run_once()
        world.clock.t += 3600
        await replies.run_once()  # the same episode: no second notice
        assert len(notice_rows(world)) == 1
        world.signal.faults.down(False)
        await replies.run_once()  # back: the episode ends
        world.signal.faults.down()
        await replies.run_once()
        world.clock.t += 601
        await replies.run_once()

    world.run(scenario)
    rows = notice_rows(world)
    assert len(rows) == 2 and {channel for _, channel in rows} == {"ntfy"}
    [first, _] = [r for r in world.records("notice") if r["notice"] == "reply_path_dead"]
    assert "HTTP 503" in first["text"]


def test_owner_is_told_once_per_episode_that_his_replies_are_read_again(world: World) -> None:
    """Failure mode: after a reply_path_dead notice the owner never learns that acks count
    again, and keeps using the console (or stops replying) long after Signal came back."""
    world.owner = OwnerSettings(
        signal_url=world.signal.url,
        signal_number=SENDER,
        recipients=(OWNER,),
        fallback_topic="owner-notices",
        receive="poll",
        receive_dead_after=600.0,
    )

    def recovered() -> list[tuple[str, str | None]]:
        rows = world.conn.execute(
            "SELECT key, channel FROM owner_outbox WHERE topic = 'reply_path_recovered'"
            " ORDER BY key"
        )
        return [(str(r[0]), r[1]) for r in rows.fetchall()]

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        world.signal.faults.down()
        await replies.run_once()
        world.clock.t += 300
        world.signal.faults.down(False)
        await replies.run_once()  # a short failure, no dead notice: nothing to say it ended
        assert recovered() == []
        world.signal.faults.down()
        await replies.run_once()
        world.clock.t += 601
        await replies.run_once()  # dead notice for this episode
        world.signal.faults.down(False)
        await replies.run_once()
        await replies.run_once()  # still fine: no second one
        assert len(recovered()) == 1

    world.run(scenario)
    [(dead_key, _)] = notice_rows(world)
    [(key, channel)] = recovered()
    # Keyed by the dead notice's episode, and sent over Signal (which works again).
    assert key.removeprefix("reply_path_recovered:") == dead_key.removeprefix("reply_path_dead:")
    assert channel != "ntfy"
    [record] = [r for r in world.records("notice") if r["notice"] == "reply_path_recovered"]
    assert "read again" in record["text"]


def test_confirmations_have_their_own_limit_so_two_bots_cannot_loop_for_ever(
    world: World,
) -> None:
    """A bot in owner.reply_from that answers every message would answer each confirmation:
    past the limit replies still act and are audited, but get no answer."""

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        for _ in range(CONFIRM_LIMIT + 5):
            world.signal.inbox.inject(SENDER, OWNER, "thanks!")
        assert await replies.run_once() == CONFIRM_LIMIT + 5
        world.clock.t += CONFIRM_WINDOW + 1  # a new hour: answered again
        world.signal.inbox.inject(SENDER, OWNER, "status")
        await replies.run_once()

    world.run(scenario)
    replies_audited = world.records("owner_reply")
    assert len(replies_audited) == CONFIRM_LIMIT + 6
    assert [r["confirmed"] for r in replies_audited].count(False) == 5
    assert replies_audited[-1]["confirmed"] is True
    queued = world.conn.execute("SELECT count(*) FROM owner_outbox WHERE topic = 'reply'")
    assert queued.fetchone()[0] == CONFIRM_LIMIT + 1


def released_payload(conn: db.Connection, delivery_key: str, incident_key: str) -> dict[str, Any]:
    """A later triage request of `incident_key`, released as the writer releases it."""
    with db.write_txn(conn):
        outbox.create(conn, delivery_key, incident_key, "update", T0, T0)
        outbox.release_due(conn, T0 + 1, relay_enabled=True, feed_append=None)
    row = conn.execute("SELECT payload FROM outbox WHERE delivery_key = ?", (delivery_key,))
    payload: dict[str, Any] = json.loads(row.fetchone()[0])
    return payload


def test_agent_is_told_the_owner_acknowledged_so_it_does_not_escalate_again(
    world: World,
) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    assert world.message("c1", "alerts:cpu") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        disk = next(m for m in world.signal.messages() if "alerts:disk" in m.message)
        world.signal.inbox.inject(SENDER, OWNER, "ack", quote=disk.timestamp)
        assert await replies.run_once() == 1

    world.run(scenario)
    assert released_payload(world.conn, "d2", "alerts:disk")["acknowledged"] is True
    assert "acknowledged" not in released_payload(world.conn, "c2", "alerts:cpu")
    # Resolved: the ack still holds (version + 1); fired again: it ended, the field is gone.
    incident(world.conn, "alerts:disk", status="resolved", version=2)
    assert released_payload(world.conn, "d3", "alerts:disk")["acknowledged"] is True
    incident(world.conn, "alerts:disk", status="firing", version=3)
    assert "acknowledged" not in released_payload(world.conn, "d4", "alerts:disk")


def test_hostile_envelopes_cost_nothing_but_themselves(world: World) -> None:
    """Failure mode: a reply's text or sender holding NUL, a lone surrogate escape or ANSI, or
    fields of the wrong type, failing the receive loop (PostgreSQL refuses NUL in text; a lone
    surrogate cannot be encoded), so the owner's real reply after it is never read."""
    assert world.message("d1", "alerts:disk") == "queued"

    def item(source: object, text: object, timestamp: object) -> dict[str, Any]:
        return {
            "envelope": {
                "source": source,
                "sourceNumber": source,
                "timestamp": timestamp,
                "dataMessage": {"message": text, "timestamp": timestamp},
            },
            "account": SENDER,
        }

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        for hostile in (
            item("+316\x00\ud83d\x1b[31m", "ack\x00", 1_764_470_001_000),
            item(OWNER, "silence \ud83d\x00 2h\x1b[2J", 1_764_470_002_000),
            item(OWNER, 5, "soon"),
            item(["+31"], {"deep": [[[]]]}, None),
            item(OWNER, "x" * (1 << 20), 1_764_470_003_000),
        ):
            world.signal.inbox.put(SENDER, hostile)
        world.signal.inbox.inject(SENDER, OWNER, "silence 2h")
        await replies.run_once()
        await sender.run_once()

    world.run(scenario)
    assert len(world.records("silence")) == 1, world.records("owner_reply")
    assert world.message("d2", "alerts:disk") == "suppressed"
    lines = json.dumps(world.records("owner_reply"), ensure_ascii=False)
    assert "\x00" not in lines and "\x1b" not in lines
