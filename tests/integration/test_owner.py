"""The owner sender over real loopback sockets: the signal-cli-rest-api stand-in and the bundled
ntfy server as the fallback topic. Time-based rules run on an injected clock; nothing sleeps.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from ntfy_intake.errors import InjectedFault
from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import audit, db
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.testbed.signal_standin import SignalHandle

from .. import harness, ports
from ..owner_bed import OWNER, PARTNER, SENDER, Clock, run

pytestmark = [
    pytest.mark.engines,
    pytest.mark.emulator(keepalive_interval=45.0, manager_interval=None),
]

FALLBACK = "owner-notices"
BIDI = "\u202e\u2066\u200f\u061c"
HOSTILE = (
    "\x1b[31mDisk\x1b[0m full\x07 on \x1b]0;pwned\x07host\r\n"
    "line two\x00\x08\x7f\x85\x9b2J end\x9d8;;http://evil\x9c"
    f"{BIDI}tail\x1bc"
)


def dead_url() -> str:
    return f"http://127.0.0.1:{ports.free_port()}"  # a port with nobody listening


def owner_settings(
    signal: SignalHandle | str | None,
    recipients: tuple[str, ...] = (OWNER,),
    fallback: str | None = FALLBACK,
) -> OwnerSettings:
    url = signal.url if isinstance(signal, SignalHandle) else signal
    return OwnerSettings(
        signal_url=url,
        signal_number=SENDER if url else None,
        recipients=recipients if url else (),
        fallback_topic=fallback,
    )


def queue(
    conn: db.Connection,
    key: str = "gap:abc",
    *,
    kind: str = "notice",
    topic: str = "gap",
    text: str = "Possible alert loss between 10:00 and 10:05.",
    due: float = 0.0,
) -> str:
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO owner_outbox(key, kind, topic, text, state, due_at, created_at)"
            " VALUES (?, ?, ?, ?, 'pending', ?, ?)",
            (key, kind, topic, text, due, due),
        )
    return key


def row(conn: db.Connection, key: str) -> dict[str, Any]:
    found = conn.execute("SELECT * FROM owner_outbox WHERE key = ?", (key,)).fetchone()
    return dict(found)


def records(tmp_path: Path, key: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in audit.read_records(tmp_path / "audit")
        if r["kind"] == "owner_message" and (key is None or r["key"] == key)
    ]


def legs(tmp_path: Path, key: str) -> list[tuple[Any, ...]]:
    return [(r.get("channel"), r["attempt"], r["result"]) for r in records(tmp_path, key)]


# -- Signal ----------------------------------------------------------------------------------------


def test_signal_201_sends_once_to_every_recipient_and_audits_without_text_or_numbers(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    key = queue(conn, text="Disk full on nas")

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make()
        assert await sender.run_once()
        assert not await sender.run_once()
        assert (sender.stats.sent_signal, sender.stats.sent_ntfy) == (1, 0)

    run(conn, tmp_path, owner_settings(signal, (OWNER, PARTNER)), scenario)
    [sent] = signal.messages()
    assert (sent.number, sent.recipients, sent.message) == (
        SENDER,
        (OWNER, PARTNER),
        "Disk full on nas",
    )
    assert (row(conn, key)["state"], row(conn, key)["channel"]) == ("sent", "signal")
    [record] = records(tmp_path, key)
    assert {k: v for k, v in record.items() if k not in ("v", "seq", "ts")} == {
        "kind": "owner_message",
        "key": key,
        "message_kind": "notice",
        "notice": "gap",
        "channel": "signal",
        "attempt": 1,
        "result": "sent",
        "status": 201,
        "detail": "HTTP 201",
        "recipients": 2,
        "signal_ts": sent.timestamp,  # what a reply quotes; a rebuild restores it
    }
    log_text = (
        (tmp_path / "audit")
        .joinpath(next(iter(sorted(p.name for p in (tmp_path / "audit").iterdir()))))
        .read_text()
    )
    assert OWNER not in log_text and PARTNER not in log_text and "Disk full" not in log_text


def test_signal_201_partial_failure_retries_only_failed_recipients(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    """The owner got it, the partner did not: the retry (after a restart, from the row) goes to
    the partner alone; the owner never gets it twice."""
    key = queue(conn, kind="triage", topic="triage", key="notify:k1", text="triage says hi")
    signal.faults.partial_failure_next(1, [PARTNER])

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        first = make(clock=Clock(1_000.0))
        assert await first.run_once()
        pending = row(conn, key)
        assert pending["state"] == "pending"
        assert json.loads(pending["signal_owed"]) == [PARTNER]
        assert pending["due_at"] > 1_000.0
        restarted = make(clock=Clock(pending["due_at"]))
        assert await restarted.run_once()

    run(conn, tmp_path, owner_settings(signal, (OWNER, PARTNER)), scenario)
    sent = signal.messages()
    assert [m.recipients for m in sent] == [(OWNER,), (PARTNER,)]
    assert sent[0].failed == (PARTNER,)
    assert row(conn, key)["state"] == "sent" and row(conn, key)["signal_owed"] is None
    got = [
        (r["result"], r["recipients"], r.get("failed"), r["message_kind"])
        for r in records(tmp_path, key)
    ]
    assert got == [("partial", 2, 1, "triage"), ("sent", 1, None, "triage")]
    assert "notice" not in records(tmp_path, key)[0]


def test_signal_bare_201_on_partial_failure_is_treated_as_sent(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    """Some API versions drop the failure list: we cannot know, so the row is sent (documented
    caveat). This pins the behaviour so a change to it is deliberate."""
    key = queue(conn)
    signal.faults.partial_failure_next(1, [PARTNER], listed=False)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        assert await make().run_once()

    run(conn, tmp_path, owner_settings(signal, (OWNER, PARTNER)), scenario)
    [sent] = signal.messages()
    assert sent.failed == (PARTNER,)
    assert row(conn, key)["state"] == "sent"


def test_signal_429_honours_retry_after(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    key = queue(conn)
    signal.faults.fail_next(1, status=429, retry_after=30)
    clock = Clock(1_000.0)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make(clock=clock, retry_base=0.01)
        assert await sender.run_once()
        assert row(conn, key)["due_at"] == pytest.approx(1_030.0)
        clock.t = 1_029.9
        assert not await sender.run_once()
        clock.t = 1_030.0
        assert await sender.run_once()

    run(conn, tmp_path, owner_settings(signal), scenario)
    assert len(signal.messages()) == 1
    assert [(r["result"], r["status"]) for r in records(tmp_path, key)] == [
        ("retry", 429),
        ("sent", 201),
    ]
    assert records(tmp_path, key)[0]["detail"] == "HTTP 429 (Retry-After 30s)"


def test_retry_schedule_survives_restart(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    """Backoff lives in the row: a restarted sender neither retries early nor resets the count."""
    key = queue(conn)
    signal.faults.fail_next(2, status=503)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        assert await make(clock=Clock(1_000.0)).run_once()
        first_due = row(conn, key)["due_at"]
        assert first_due == pytest.approx(1_001.0)  # attempt 1: base 2, jitter 0 -> 1s
        assert not await make(clock=Clock(first_due - 0.01)).run_once()
        assert await make(clock=Clock(first_due)).run_once()
        second_due = row(conn, key)["due_at"]
        assert second_due - first_due == pytest.approx(2.0)  # attempt 2: doubled
        assert row(conn, key)["signal_failing_since"] == pytest.approx(1_000.0)
        assert await make(clock=Clock(second_due)).run_once()

    run(conn, tmp_path, owner_settings(signal, fallback=None), scenario)
    assert [(r["attempt"], r["result"]) for r in records(tmp_path, key)] == [
        (1, "retry"),
        (2, "retry"),
        (3, "sent"),
    ]
    assert row(conn, key)["attempts"] == 3


def test_signal_timeout_is_retried_and_may_duplicate(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    """No idempotency key: a send that stalls past the timeout went out, and the retry sends it
    again. At-least-once is the accepted trade; silence is not."""
    key = queue(conn)
    signal.faults.stall_next(1, 3.0)
    clock = Clock(1_000.0)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make(clock=clock, timeout=0.3)
        assert await sender.run_once()
        assert row(conn, key)["state"] == "pending"
        clock.t = row(conn, key)["due_at"]
        assert await sender.run_once()

    run(conn, tmp_path, owner_settings(signal), scenario)
    assert len(signal.messages()) == 2
    first = records(tmp_path, key)[0]
    assert first["result"] == "retry" and "timeout" in first["detail"] and "status" not in first


def test_signal_400_falls_back_at_once(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle, emu: NtfyEmulator
) -> None:
    key = queue(conn, key="dead_row:k1:3", topic="dead_row", text="row k1 is dead")
    signal.faults.fail_next(1, status=400)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make()
        assert await sender.run_once()
        assert (sender.stats.fallbacks, sender.stats.sent_ntfy) == (1, 1)

    run(conn, tmp_path, owner_settings(signal), scenario, ntfy_url=emu.url)
    assert signal.messages() == []
    [published] = emu.messages(FALLBACK)
    assert (published["message"], published["title"]) == ("row k1 is dead", "ntfy-intake: dead_row")
    assert (row(conn, key)["state"], row(conn, key)["channel"]) == ("sent", "ntfy")
    assert [
        (r["channel"], r["attempt"], r["result"], r["status"]) for r in records(tmp_path, key)
    ] == [
        ("signal", 1, "fallback", 400),
        ("ntfy", 1, "sent", 200),
    ]


def test_signal_400_without_fallback_marks_dead(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    key = queue(conn)
    signal.faults.fail_next(1, status=400)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make()
        assert await sender.run_once()
        assert sender.stats.dead == 1

    run(conn, tmp_path, owner_settings(signal, fallback=None), scenario)
    assert row(conn, key)["state"] == "dead"
    assert "no owner.fallback_topic" in row(conn, key)["last_error"]
    assert legs(tmp_path, key) == [("signal", 1, "dead")]


def test_error_bodies_naming_recipients_are_redacted(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle, emu: NtfyEmulator
) -> None:
    """signal-cli-rest-api's 400 names the recipient ("untrusted identity for +31..."): neither
    the audit, the row nor the operator log may carry it."""
    key = queue(conn)
    signal.faults.partial_failure_next(1, [OWNER])  # every recipient fails: the stand-in's 400

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        with capture_logs() as logs:
            assert await make().run_once()
        assert OWNER not in repr(logs)

    run(conn, tmp_path, owner_settings(signal), scenario, ntfy_url=emu.url)
    [fallback, sent] = records(tmp_path, key)
    assert fallback["result"] == "fallback" and "<recipient>" in fallback["detail"]
    assert sent["result"] == "sent" and sent["channel"] == "ntfy"
    assert OWNER not in json.dumps(records(tmp_path)) + str(row(conn, key))


def test_signal_down_past_fallback_after_uses_ntfy_topic(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle, emu: NtfyEmulator
) -> None:
    """Signal answers 503 for good: retries until `fallback_after` has passed since the first
    failure (the retry is never scheduled later than that), then the fallback topic."""
    key = queue(conn)
    signal.faults.down()
    clock = Clock(1_000.0)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make(clock=clock, retry_base=100.0, fallback_after=250.0)
        assert await sender.run_once()  # 503 at 1000: retry at 1050
        clock.t = row(conn, key)["due_at"]
        assert clock.t == pytest.approx(1_050.0)
        assert await sender.run_once()  # 503 at 1050: retry at 1150
        clock.t = row(conn, key)["due_at"]
        assert clock.t == pytest.approx(1_150.0)
        assert await sender.run_once()  # 503 at 1150: backoff says 1300, capped at 1250
        assert row(conn, key)["due_at"] == pytest.approx(1_250.0)
        assert emu.messages(FALLBACK) == []
        clock.t = 1_250.0
        assert await sender.run_once()

    run(conn, tmp_path, owner_settings(signal), scenario, ntfy_url=emu.url)
    assert len(emu.messages(FALLBACK)) == 1
    assert (row(conn, key)["state"], row(conn, key)["channel"]) == ("sent", "ntfy")
    assert legs(tmp_path, key) == [
        ("signal", 1, "retry"),
        ("signal", 2, "retry"),
        ("signal", 3, "retry"),
        ("signal", 4, "fallback"),
        ("ntfy", 4, "sent"),
    ]


def test_signal_exhausted_before_fallback_after_uses_ntfy_topic(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle, emu: NtfyEmulator
) -> None:
    key = queue(conn)
    signal.faults.fail_next(2, status=500)
    clock = Clock(1_000.0)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make(clock=clock, max_attempts=2, fallback_after=3600.0)
        assert await sender.run_once()
        clock.t = row(conn, key)["due_at"]
        assert await sender.run_once()

    run(conn, tmp_path, owner_settings(signal), scenario, ntfy_url=emu.url)
    assert legs(tmp_path, key) == [
        ("signal", 1, "retry"),
        ("signal", 2, "fallback"),
        ("ntfy", 2, "sent"),
    ]
    assert len(emu.messages(FALLBACK)) == 1


def test_signal_exhausted_without_fallback_marks_dead(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    key = queue(conn)
    signal.faults.down()
    clock = Clock(1_000.0)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make(clock=clock, max_attempts=2)
        assert await sender.run_once()
        clock.t = row(conn, key)["due_at"]
        assert await sender.run_once()
        clock.t += 10_000
        assert not await sender.run_once()

    run(conn, tmp_path, owner_settings(signal, fallback=None), scenario)
    assert row(conn, key)["state"] == "dead"
    assert legs(tmp_path, key) == [("signal", 1, "retry"), ("signal", 2, "dead")]


# -- the fallback topic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "topic", "priority", "title"),
    [
        ("notice", "gap", 5, "ntfy-intake: gap"),
        ("notice", "latch", 5, "ntfy-intake: latch"),
        ("notice", "intake_dead", 5, "ntfy-intake: intake_dead"),
        ("notice", "fallback_400", 4, "ntfy-intake: fallback_400"),
        ("notice", "dead_row", 4, "ntfy-intake: dead_row"),
        ("triage", "triage", 4, "ntfy-intake: triage"),
    ],
)
def test_notice_about_loss_uses_priority_5_on_fallback(
    conn: db.Connection,
    tmp_path: Path,
    emu: NtfyEmulator,
    kind: str,
    topic: str,
    priority: int,
    title: str,
) -> None:
    """Signal not configured: every message goes straight to the fallback topic; loss notices
    (gap, latch, intake_dead) are urgent, everything else high."""
    key = queue(conn, key=f"{topic}:x", kind=kind, topic=topic)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        assert await make().run_once()

    run(conn, tmp_path, owner_settings(None), scenario, ntfy_url=emu.url)
    [published] = emu.messages(FALLBACK)
    assert (published["priority"], published["title"]) == (priority, title)
    assert "ntfy-intake" in published["tags"]
    assert legs(tmp_path, key) == [("ntfy", 1, "sent")]


def test_fallback_publish_sends_bearer_token_and_plain_body(
    conn: db.Connection, tmp_path: Path
) -> None:
    queue(conn, text="hello owner")
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "abcdefghijkl", "event": "message"})

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        assert await make(ntfy_token="tk_secretsecretsecretsecretsecre").run_once()

    run(
        conn,
        tmp_path,
        owner_settings(None),
        scenario,
        ntfy_url="http://ntfy.invalid/",
        transport=httpx.MockTransport(handler),
    )
    [request] = seen
    assert str(request.url) == f"http://ntfy.invalid/{FALLBACK}"
    assert request.headers["Authorization"] == "Bearer tk_secretsecretsecretsecretsecre"
    assert request.content == b"hello owner"
    assert "secret" not in json.dumps(records(tmp_path))


def test_fallback_topic_down_retries_on_ntfy_then_marks_dead(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    """Once routed to the fallback, later attempts stay there (Signal is not asked again) and
    the fallback has its own attempt budget."""
    key = queue(conn)
    signal.faults.fail_next(1, status=400)
    clock = Clock(1_000.0)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make(clock=clock, max_attempts=2)
        assert await sender.run_once()
        assert (row(conn, key)["state"], row(conn, key)["channel"]) == ("pending", "ntfy")
        clock.t = row(conn, key)["due_at"]
        assert await sender.run_once()

    run(conn, tmp_path, owner_settings(signal), scenario, ntfy_url=dead_url())
    assert signal.messages() == []
    assert legs(tmp_path, key) == [
        ("signal", 1, "fallback"),
        ("ntfy", 1, "retry"),
        ("ntfy", 2, "dead"),
    ]
    assert (row(conn, key)["state"], row(conn, key)["ntfy_attempts"]) == ("dead", 2)


def test_no_channel_configured_marks_dead_and_audits(conn: db.Connection, tmp_path: Path) -> None:
    keys = [queue(conn, key="gap:1"), queue(conn, key="latch:1", topic="latch")]

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make()
        with capture_logs() as logs:
            assert await sender.run_once()
        assert sender.stats.dead == 2
        assert [entry["event"] for entry in logs if entry["log_level"] == "error"].count(
            "owner.no_channel"
        ) == 1

    run(conn, tmp_path, owner_settings(None, fallback=None), scenario)
    for key in keys:
        assert row(conn, key)["state"] == "dead"
        assert "owner.fallback_topic" in row(conn, key)["last_error"]
        [record] = records(tmp_path, key)
        assert record["result"] == "dead" and "channel" not in record
        assert "no owner channel configured" in record["detail"]


# -- crash safety, sanitizing, the loop ----------------------------------------------------------


def test_crash_between_send_and_settle_resends_at_least_once(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    key = queue(conn)

    def crash() -> None:
        raise InjectedFault("killed after the send")

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        with pytest.raises(InjectedFault):
            await make(after_send=crash).run_once()
        assert row(conn, key)["state"] == "leased"
        assert records(tmp_path, key) == []
        restarted = make()
        stop = asyncio.Event()
        task = asyncio.create_task(restarted.run(stop))
        async with asyncio.timeout(10):
            while row(conn, key)["state"] != "sent":
                await asyncio.sleep(0.01)
        stop.set()
        restarted.wakeup.set()
        await task

    run(conn, tmp_path, owner_settings(signal), scenario)
    assert len(signal.messages()) == 2  # the duplicate is the documented at-least-once price
    assert legs(tmp_path, key) == [("signal", 2, "sent")]


def test_expired_lease_is_taken_over_without_restart(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    key = queue(conn)
    clock = Clock(1_000.0)

    def crash() -> None:
        raise InjectedFault()

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        with pytest.raises(InjectedFault):
            await make(clock=clock, after_send=crash).run_once()
        sender = make(clock=clock)
        assert not await sender.run_once()  # leased, lease still running
        clock.t = row(conn, key)["lease_until"]
        assert await sender.run_once()

    run(conn, tmp_path, owner_settings(signal), scenario)
    assert len(signal.messages()) == 2
    assert row(conn, key)["state"] == "sent"


def _assert_clean(text: str) -> None:
    for char in text:
        assert char == "\n" or unicodedata.category(char) not in ("Cc", "Cf", "Cs"), repr(char)


def test_text_reaching_signal_has_no_control_characters(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    queue(conn, text=HOSTILE)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        assert await make().run_once()

    run(conn, tmp_path, owner_settings(signal), scenario)
    [sent] = signal.messages()
    _assert_clean(sent.message)
    # PostgreSQL text holds no NUL: the store keeps it as U+FFFD (postgres._text), which is
    # text, not a control character, so it reaches the owner where SQLite's NUL was dropped.
    nul = "\ufffd" if harness.DATABASE is not None else ""
    assert sent.message == f"Disk full on host\nline two{nul}\n endtail"


def test_text_reaching_the_fallback_topic_has_no_control_characters(
    conn: db.Connection, tmp_path: Path, emu: NtfyEmulator
) -> None:
    queue(conn, text=HOSTILE + "é" * 5000)

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        assert await make().run_once()

    run(conn, tmp_path, owner_settings(None), scenario, ntfy_url=emu.url)
    [published] = emu.messages(FALLBACK)
    _assert_clean(published["message"])
    assert published["message"].startswith("Disk full on host\nline two")
    assert published["message"].endswith("…") and len(published["message"]) <= 2000


def test_run_loop_sends_a_row_queued_while_idle_when_woken(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    async def scenario(make: Callable[..., OwnerSender]) -> None:
        sender = make()
        stop = asyncio.Event()
        task = asyncio.create_task(sender.run(stop))
        await asyncio.sleep(0.05)
        key = queue(conn)
        sender.wakeup.set()
        async with asyncio.timeout(10):
            while row(conn, key)["state"] != "sent":
                await asyncio.sleep(0.01)
        stop.set()
        sender.wakeup.set()
        await task

    run(conn, tmp_path, owner_settings(signal), scenario)
    assert len(signal.messages()) == 1
