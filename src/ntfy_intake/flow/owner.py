"""The owner sender: deliver pending owner_outbox rows over Signal, falling back to an ntfy topic.

Same shape as the relay: claim one row (a lease), send with no transaction open, settle in a short
transaction that also stages the audit records, flush the audit log. All state that must survive a
restart lives in the row: the attempt count, when the next attempt is due, which channel the next
attempt uses (`channel`), the Signal recipients still owed after a partial failure (`signal_owed`),
when Signal started failing for the row (`signal_failing_since`) and the fallback's own attempt
count (`ntfy_attempts`).

Delivery is at-least-once, never exactly-once: signal-cli-rest-api has no idempotency key, so a
crash between the send and the settle, or a timeout after the server already sent, re-sends.

One claim is one "attempt" (the row's `attempts` counter, `attempt` in the audit). An attempt has
one or two legs, each audited as an `owner_message` record:
- a Signal leg: `sent` | `partial` (some recipients failed; retry later to those only) | `retry` |
  `fallback` (Signal gave up for this row: 400-class answer, `max_attempts` spent, or failing for
  `fallback_after` seconds) | `dead` (Signal gave up and there is no fallback topic);
- an ntfy leg (the fallback topic), right after a Signal `fallback` in the same attempt, or alone
  once the row is routed there: `sent` | `retry` | `dead`.

The pure rules that carry the decisions (`prepare_text`, `classify_signal`, `classify_ntfy`,
`failed_recipients`, `ntfy_headers`, `redact`) live in owner_channels.py; the row's claim and
settle are store/owner_outbox.py's; `OwnerSender` is the loop around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import structlog

from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import audit, db, outbox, owner_outbox
from ntfy_intake.store.owner_outbox import Claim, claim_due
from ntfy_intake.wire.owner_channels import (
    _NO_CHANNEL,
    CLAIM_BATCH,
    Channel,
    LegResult,
    classify_ntfy,
    classify_signal,
    ntfy_headers,
    prepare_text,
    redact,
    retry_delay,
    sent_timestamp,
)

log = structlog.get_logger("ntfy_intake.owner")

# The longest idle sleep with no row due: what bounds a row queued without a wake (another
# process, a path that forgot `wakeup`). Every in-process queue sets `wakeup` after COMMIT.
IDLE_CAP_S = 60.0

# An attempt the lease stopped before anything was sent (never settled: its write is fenced).
NOT_LEADING = "not sent: this node's lease is over (a standby leads now)"

__all__ = [
    "Claim",
    "Leg",
    "OwnerSender",
    "OwnerStats",
    "claim_due",
]

# -- the sender ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Leg:
    """One audited step of an attempt."""

    channel: Channel | None
    result: LegResult
    status: int | None
    detail: str
    recipients: int | None = None  # Signal: how many recipients the send was addressed to
    failed: int | None = None  # Signal: how many of them failed


@dataclass(slots=True)
class Settlement:
    state: Literal["pending", "sent", "dead"]
    legs: list[Leg]
    channel: str | None
    due_at: float | None = None
    error: str | None = None
    owed: tuple[str, ...] | None = None
    failing_since: float | None = None
    ntfy_attempts: int = 0
    sent_request: bool = False
    signal_ts: int | None = None  # the 201's timestamp: what the owner's reply quotes


@dataclass(slots=True)
class OwnerStats:
    attempts: int = 0
    sent_signal: int = 0
    sent_ntfy: int = 0
    partial: int = 0
    retries: int = 0
    fallbacks: int = 0
    dead: int = 0
    by_result: dict[str, int] = field(default_factory=dict)


class OwnerSender:
    def __init__(
        self,
        conn: db.Connection,
        client: httpx.AsyncClient,
        *,
        run_db: db.Runner,
        owner: OwnerSettings,
        ntfy_url: str,
        ntfy_token: str | None,
        clock: Callable[[], float],
        flush_audit: Callable[[], Awaitable[bool]],
        timeout: float = 10.0,
        rng: Callable[[], float] = random.random,
        retry_base: float = 2.0,
        fallback_after: float = 300.0,
        max_attempts: int = 12,
        after_send: Callable[[], None] = lambda: None,
        may_act: Callable[[], bool] = lambda: True,
        buttons: Callable[[str], Awaitable[dict[str, str]]] | None = None,
    ) -> None:
        self.conn = conn
        # The fallback topic's action buttons (flow/owner_buttons.py): extra publish headers
        # for a message key; None without `http.public_url`.
        self.buttons = buttons
        self.client = client
        self.run_db = run_db
        self.owner = owner
        self.ntfy_url = ntfy_url.rstrip("/")
        self.ntfy_token = ntfy_token
        self.clock = clock
        self.flush_audit = flush_audit
        self.timeout = timeout
        self.rng = rng
        self.retry_base = retry_base
        self.fallback_after = fallback_after
        self.max_attempts = max_attempts
        self.after_send = after_send
        # Asked right before each send (each leg): False once this node's lease is over
        # (DESIGN.md section 9); the claim stays leased and the next leader sends it.
        self.may_act = may_act
        self.wakeup = asyncio.Event()
        self.stats = OwnerStats()
        # At most two sends per claim, each bounded by `timeout` (plus a second of slack).
        self.lease = 2 * (timeout + 1.0) + 5.0
        self._known = (*owner.recipients, *([owner.signal_number] if owner.signal_number else []))
        self._no_channel_logged = False
        self._next_due: float | None = None  # as the last claim that found nothing left it

    @property
    def signal_configured(self) -> bool:
        o = self.owner
        return bool(o.signal_url and o.signal_number and o.recipients)

    @property
    def fallback_configured(self) -> bool:
        return bool(self.owner.fallback_topic and self.ntfy_url)

    # -- loop ------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        released = await self.run_db(outbox.release_leases, self.conn, "owner_outbox")
        if released:
            log.warning("owner.leases_released", rows=released)
        while not stop.is_set() and self.may_act():
            self.wakeup.clear()
            if await self.run_once():
                continue
            # Asleep until the next row falls due (a retry, a lease running out), or until a row
            # is queued in this process (`wakeup`: set once its transaction committed, see
            # journal.wake_owner); never a poll each second (issue 36). The cap bounds a row
            # queued by a path that forgot to wake it, or by another process.
            wait = IDLE_CAP_S if self._next_due is None else self._next_due - self.clock()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=min(IDLE_CAP_S, max(0.0, wait)))

    async def run_once(self) -> bool:
        """Send every due row (up to a batch); True if any row was claimed."""
        claimed = 0
        while claimed < CLAIM_BATCH and self.may_act():
            claim = await self.run_db(self._claim, self.clock())
            if claim is None:
                break
            claimed += 1
            settlement = await self.attempt(claim)
            if settlement.sent_request:
                self.after_send()
            await self.run_db(self._settle, claim, settlement)
        if claimed:
            await self.flush_audit()
        return claimed > 0

    def _claim(self, now: float) -> Claim | None:
        """In the worker thread: the next due row, leased; with none, when the next one falls
        due, read in the same trip (the idle wait in `run`)."""
        claim = claim_due(self.conn, now, lease=self.lease)
        if claim is None:
            self._next_due = outbox.next_due_at(self.conn, "owner_outbox")
        return claim

    # -- one attempt (network, no transaction open) ------------------------------------------------

    async def attempt(self, claim: Claim) -> Settlement:
        self.stats.attempts += 1
        text = prepare_text(claim.text)
        now = self.clock()
        if not self.signal_configured and not self.fallback_configured:
            if not self._no_channel_logged:
                self._no_channel_logged = True
                log.error("owner.no_channel", detail=_NO_CHANNEL)
            return Settlement(
                "dead", [Leg(None, "dead", None, _NO_CHANNEL)], None, error=_NO_CHANNEL
            )
        if claim.channel == "ntfy" or not self.signal_configured:
            return await self._ntfy_leg(claim, text, [])
        if (
            self.fallback_configured
            and claim.failing_since is not None
            and now - claim.failing_since >= self.fallback_after
        ):
            detail = (
                f"Signal failing for {now - claim.failing_since:.0f}s "
                f"(fallback_after {self.fallback_after:g}s)"
            )
            return await self._ntfy_leg(claim, text, [Leg("signal", "fallback", None, detail)])
        return await self._signal_leg(claim, text)

    async def _signal_leg(self, claim: Claim, text: str) -> Settlement:
        configured = self.owner.recipients
        targets = (
            configured if claim.owed is None else tuple(r for r in claim.owed if r in configured)
        )
        if not targets:
            detail = "every recipient still owed was removed from owner.recipients"
            return Settlement("sent", [Leg("signal", "sent", None, detail, 0)], "signal")
        started = self.clock()
        body = {"message": text, "number": self.owner.signal_number, "recipients": list(targets)}
        status, headers, content, error = await self._post(
            f"{(self.owner.signal_url or '').rstrip('/')}/v2/send", json.dumps(body).encode(), None
        )
        now = self.clock()
        outcome = classify_signal(status, headers, content, error, now, targets)
        detail = redact(outcome.detail, self._known)
        count = len(targets)
        signal_ts = sent_timestamp(content) if outcome.kind in ("sent", "partial") else None
        if outcome.kind == "sent":
            return Settlement(
                "sent",
                [Leg("signal", "sent", status, detail, count)],
                "signal",
                sent_request=True,
                signal_ts=signal_ts,
            )
        failing_since = claim.failing_since if claim.failing_since is not None else started
        owed = outcome.failed or targets
        failed = len(outcome.failed) if outcome.failed else None
        exhausted = claim.attempt >= self.max_attempts
        overdue = self.fallback_configured and now - failing_since >= self.fallback_after
        if outcome.kind == "permanent" or exhausted or overdue:
            why = "permanent" if outcome.kind == "permanent" else "exhausted" if exhausted else ""
            if overdue and not why:
                why = f"failing for {now - failing_since:.0f}s"
            if self.fallback_configured:
                leg = Leg("signal", "fallback", status, f"{detail}; {why}", count, failed)
                settlement = await self._ntfy_leg(claim, text, [leg])
                settlement.owed = owed
                settlement.failing_since = failing_since
                settlement.sent_request = True
                return settlement
            error = f"{detail}; {why}, no owner.fallback_topic"
            return Settlement(
                "dead",
                [Leg("signal", "dead", status, error, count, failed)],
                "signal",
                error=error,
                owed=owed,
                failing_since=failing_since,
                sent_request=True,
            )
        due = now + retry_delay(claim.attempt, outcome.retry_after, self.rng, base=self.retry_base)
        if self.fallback_configured:
            due = min(due, failing_since + self.fallback_after)
        result: LegResult = "partial" if outcome.kind == "partial" else "retry"
        return Settlement(
            "pending",
            [Leg("signal", result, status, detail, count, failed)],
            "signal",
            due_at=due,
            error=detail,
            owed=owed,
            failing_since=failing_since,
            sent_request=True,
            signal_ts=signal_ts,
        )

    async def _ntfy_leg(self, claim: Claim, text: str, legs: list[Leg]) -> Settlement:
        assert self.owner.fallback_topic is not None
        url = f"{self.ntfy_url}/{self.owner.fallback_topic}"
        plain = ntfy_headers(claim.kind, claim.topic, self.ntfy_token)
        extra = {} if self.buttons is None else await self.buttons(claim.key)
        status, answer_headers, content, error = await self._post(
            url, text.encode("utf-8"), {**plain, **extra}
        )
        now = self.clock()
        outcome = classify_ntfy(status, answer_headers, content, error, now)
        if extra and outcome.kind == "permanent":
            # The buttons are a convenience; the message is what the owner needs. A server that
            # refuses the buttons (40018, or any other 4xx) gets the message without them.
            log.warning("owner.buttons_refused", key=claim.key, detail=redact(outcome.detail))
            status, answer_headers, content, error = await self._post(
                url, text.encode("utf-8"), plain
            )
            now = self.clock()
            outcome = classify_ntfy(status, answer_headers, content, error, now)
        detail = redact(outcome.detail, self._known)
        attempt = claim.ntfy_attempts + 1

        def settle(state: Literal["pending", "sent", "dead"], leg: Leg, **extra: Any) -> Settlement:
            return Settlement(
                state,
                [*legs, leg],
                "ntfy",
                owed=claim.owed,
                failing_since=claim.failing_since,
                ntfy_attempts=attempt,
                sent_request=True,
                **extra,
            )

        if outcome.kind == "sent":
            return settle("sent", Leg("ntfy", "sent", status, detail))
        if outcome.kind == "retry" and attempt < self.max_attempts:
            due = now + retry_delay(attempt, outcome.retry_after, self.rng, base=self.retry_base)
            return settle("pending", Leg("ntfy", "retry", status, detail), due_at=due, error=detail)
        error = f"{detail}; {'permanent' if outcome.kind == 'permanent' else 'exhausted'}"
        return settle("dead", Leg("ntfy", "dead", status, error), error=error)

    async def _post(
        self, url: str, content: bytes, headers: dict[str, str] | None
    ) -> tuple[int | None, httpx.Headers | None, bytes, str | None]:
        if headers is None:
            headers = {"Content-Type": "application/json"}
        if not self.may_act():
            return None, None, b"", NOT_LEADING
        try:
            async with asyncio.timeout(self.timeout + 1.0):
                response = await self.client.post(
                    url, content=content, headers=headers, timeout=self.timeout
                )
        except (httpx.TimeoutException, TimeoutError) as exc:
            return None, None, b"", f"timeout ({type(exc).__name__}): may have been sent"
        except httpx.HTTPError as exc:
            return None, None, b"", f"{type(exc).__name__}: {exc}"
        return response.status_code, response.headers, response.content, None

    # -- settle (short transaction) ------------------------------------------------------------------

    def _settle(self, claim: Claim, settlement: Settlement) -> None:
        now = self.clock()
        with db.write_txn(self.conn) as txn:
            settled = owner_outbox.settle(
                self.conn,
                claim,
                settlement.state,
                now,
                due_at=settlement.due_at,
                channel=settlement.channel,
                error=settlement.error,
                owed=settlement.owed,
                failing_since=settlement.failing_since,
                ntfy_attempts=settlement.ntfy_attempts,
            )
            # Stored even when the lease moved on: the message went out and may be quoted.
            if settlement.signal_ts is not None:
                owner_outbox.record_signal_sent(self.conn, claim.key, settlement.signal_ts, now)
            if settled:
                for leg in settlement.legs:
                    audit.stage(
                        self.conn,
                        "owner_message",
                        now,
                        key=claim.key,
                        message_kind=claim.kind,
                        notice=claim.topic if claim.kind == "notice" else None,
                        channel=leg.channel,
                        attempt=claim.attempt,
                        result=leg.result,
                        status=leg.status,
                        detail=leg.detail,
                        recipients=leg.recipients,
                        failed=leg.failed,
                        # What the owner's reply quotes: a rebuild restores it (rebuild.py).
                        signal_ts=settlement.signal_ts if leg.channel == "signal" else None,
                    )
                # The counters follow what is durable: a COMMIT that fails and is run again
                # counts the attempt once.
                txn.after_commit(lambda: self._count(claim, settlement))

    def _count(self, claim: Claim, settlement: Settlement) -> None:
        fields: dict[str, Any] = {"key": claim.key, "attempt": claim.attempt}
        for leg in settlement.legs:
            self.stats.by_result[leg.result] = self.stats.by_result.get(leg.result, 0) + 1
            if leg.result == "fallback":
                self.stats.fallbacks += 1
                log.warning("owner.fallback", **fields, detail=leg.detail)
            elif leg.result == "partial":
                self.stats.partial += 1
            elif leg.result == "retry":
                self.stats.retries += 1
        last = settlement.legs[-1]
        if settlement.state == "sent":
            if last.channel == "ntfy":
                self.stats.sent_ntfy += 1
            else:
                self.stats.sent_signal += 1
            log.info("owner.sent", **fields, channel=last.channel)
        elif settlement.state == "dead":
            self.stats.dead += 1
            log.error("owner.dead", **fields, channel=last.channel, detail=last.detail)
        else:
            log.warning(
                "owner.retry_scheduled",
                **fields,
                channel=last.channel,
                result=last.result,
                detail=last.detail,
            )
