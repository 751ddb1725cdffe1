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

Pure helpers (`prepare_text`, `classify_signal`, `classify_ntfy`, `failed_recipients`,
`ntfy_headers`, `redact`) carry the decisions; `OwnerSender` is the loop around them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import re
import sqlite3
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import structlog

from ntfy_intake import audit, backoff, db, outbox, sanitize
from ntfy_intake.settings import OwnerSettings

log = structlog.get_logger("ntfy_intake.owner")

__all__ = [
    "LOSS_NOTICES",
    "OWNER_MIGRATIONS",
    "TEXT_LIMIT",
    "Claim",
    "Leg",
    "NtfyOutcome",
    "OwnerSender",
    "OwnerStats",
    "SignalOutcome",
    "claim_due",
    "classify_ntfy",
    "classify_signal",
    "failed_recipients",
    "ntfy_headers",
    "prepare_text",
    "redact",
]

# Schema additions for the owner sender (the daemon appends them to its migration list).
OWNER_MIGRATIONS: list[tuple[str, list[str]]] = [
    (
        "owner_001_delivery_state",
        [
            # JSON array of Signal recipients still owed after a partial failure; NULL = all.
            "ALTER TABLE owner_outbox ADD COLUMN signal_owed TEXT",
            # Start of the first failed Signal attempt still unresolved: the fallback clock.
            "ALTER TABLE owner_outbox ADD COLUMN signal_failing_since REAL",
            # Attempts on the fallback topic (its own max_attempts budget).
            "ALTER TABLE owner_outbox ADD COLUMN ntfy_attempts INTEGER NOT NULL DEFAULT 0",
        ],
    ),
]

TEXT_LIMIT = 2000  # characters
BYTE_LIMIT = 3900  # UTF-8 bytes: ntfy turns a body of 4096 bytes or more into an attachment (400)
RETRY_CAP = 300.0
CLAIM_BATCH = 16
DETAIL_LIMIT = 200
# Notices about possible or actual loss: priority 5 on the fallback topic.
LOSS_NOTICES = frozenset({"gap", "latch", "intake_dead"})
_ELLIPSIS = "…"
_EMPTY_TEXT = "(empty message)"
_NO_CHANNEL = (
    "no owner channel configured: set owner.signal_url (with signal_number and recipients) "
    "or owner.fallback_topic"
)

Channel = Literal["signal", "ntfy"]
LegResult = Literal["sent", "partial", "retry", "fallback", "dead"]


# -- pure helpers --------------------------------------------------------------------------------


def prepare_text(text: str, *, limit: int = TEXT_LIMIT, byte_limit: int = BYTE_LIMIT) -> str:
    """What reaches Signal or ntfy: controls, ANSI and bidi stripped (newlines kept, tabs become
    spaces), trailing whitespace dropped, cut to `limit` characters and `byte_limit` UTF-8 bytes
    (a cut text ends with "…"). Never empty."""
    clean = sanitize.strip_control(text, keep_newlines=True).replace("\t", " ")
    clean = "\n".join(line.rstrip() for line in clean.split("\n")).strip()
    if not clean:
        return _EMPTY_TEXT
    if len(clean) <= limit and len(clean.encode("utf-8")) <= byte_limit:
        return clean
    budget = byte_limit - len(_ELLIPSIS.encode("utf-8"))
    cut = clean[: limit - 1].encode("utf-8")[:budget].decode("utf-8", "ignore")
    return cut.rstrip() + _ELLIPSIS


_PHONE = re.compile(r"\+[0-9][0-9 ]{4,}[0-9]|[0-9]{7,}")
_GROUP = re.compile(r"group\.[A-Za-z0-9+/=_-]+")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def redact(text: str, known: Iterable[str] = ()) -> str:
    """One safe line for logs and the audit: no recipient numbers, group ids or uuids, no
    URLs, no controls, at most 200 characters. `known` (e.g. the configured numbers) are removed first."""
    for secret in sorted((k for k in known if k), key=len, reverse=True):
        text = text.replace(secret, "<recipient>")
    text = _URL.sub("<url>", text)
    text = _GROUP.sub("<group>", text)
    text = _UUID.sub("<uuid>", text)
    text = _PHONE.sub("<number>", text)
    return sanitize.one_line(text, DETAIL_LIMIT)


def _body_excerpt(body: bytes) -> str:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return str(parsed["error"])
    return body[:DETAIL_LIMIT].decode("utf-8", "replace")


def _identifiers(entry: object) -> set[str]:
    """Every recipient spelling a listed failure may use (stand-in, signal-cli json-rpc)."""
    if isinstance(entry, str):
        return {entry}
    if not isinstance(entry, dict):
        return set()
    found: set[str] = set()
    for name in ("recipient", "number", "uuid", "address", "username"):
        value = entry.get(name)
        if isinstance(value, str) and value:
            found.add(value)
    address = entry.get("recipientAddress")
    if isinstance(address, dict):
        found |= _identifiers(address)
    elif isinstance(address, str):
        found.add(address)
    for name in ("groupId", "group_id"):
        value = entry.get(name)
        if isinstance(value, str) and value:
            encoded = base64.b64encode(value.encode()).decode()
            found |= {value, f"group.{value}", f"group.{encoded}"}
    return found


def _listed_failures(body: bytes) -> list[object]:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return []
    if not isinstance(parsed, dict):
        return []
    entries: list[object] = []
    errors = parsed.get("errors")
    if isinstance(errors, list):
        entries.extend(errors)
    elif isinstance(errors, dict):
        entries.extend(errors)  # {"<recipient>": "<error>"}
    results = parsed.get("results")
    if isinstance(results, list):
        entries.extend(
            r
            for r in results
            if isinstance(r, dict) and isinstance(r.get("type"), str) and r["type"] != "SUCCESS"
        )
    return entries


def failed_recipients(body: bytes, requested: Sequence[str]) -> tuple[str, ...]:
    """The requested recipients a 2xx body lists as failed, in request order.

    A listed failure that names none of the requested recipients (a group member, an unknown
    shape) cannot be pinned down: it counts against the requested groups, or against every
    requested recipient when there is no group. Over-sending beats silence here."""
    failed: set[str] = set()
    unmapped = 0
    wanted = set(requested)
    for entry in _listed_failures(body):
        matched = _identifiers(entry) & wanted
        if matched:
            failed |= matched
        else:
            unmapped += 1
    if unmapped:
        groups = {r for r in requested if r.startswith("group.")}
        failed |= groups or wanted
    return tuple(r for r in requested if r in failed)


@dataclass(frozen=True, slots=True)
class SignalOutcome:
    kind: Literal["sent", "partial", "retry", "permanent"]
    detail: str
    status: int | None = None
    retry_after: float | None = None
    failed: tuple[str, ...] = ()  # partial / retry-after-201: the recipients still owed


def _retry_detail(status: int, retry_after: float | None) -> str:
    if retry_after is None:
        return f"HTTP {status}"
    return f"HTTP {status} (Retry-After {retry_after:g}s)"


def classify_signal(
    status: int | None,
    headers: httpx.Headers | None,
    body: bytes,
    error: str | None,
    now: float,
    requested: Sequence[str],
) -> SignalOutcome:
    """What a `POST /v2/send` answer means. `status` is None when no response arrived (timeout,
    connection error): ambiguous, the message may have gone out; it is retried anyway."""
    if status is None:
        return SignalOutcome("retry", error or "no response")
    if 200 <= status < 300:
        failed = failed_recipients(body, requested)
        if not failed:
            return SignalOutcome("sent", f"HTTP {status}", status)
        if len(failed) == len(requested):
            return SignalOutcome(
                "retry", f"HTTP {status} listing every recipient as failed", status, failed=failed
            )
        return SignalOutcome(
            "partial",
            f"HTTP {status} with {len(failed)} of {len(requested)} recipient(s) failed",
            status,
            failed=failed,
        )
    if status in (408, 429) or status >= 500:
        retry_after = backoff.parse_retry_after(
            headers.get("Retry-After") if headers else None, now
        )
        return SignalOutcome("retry", _retry_detail(status, retry_after), status, retry_after)
    return SignalOutcome("permanent", f"HTTP {status}: {_body_excerpt(body)}", status)


@dataclass(frozen=True, slots=True)
class NtfyOutcome:
    kind: Literal["sent", "retry", "permanent"]
    detail: str
    status: int | None = None
    retry_after: float | None = None


def classify_ntfy(
    status: int | None, headers: httpx.Headers | None, body: bytes, error: str | None, now: float
) -> NtfyOutcome:
    """What a publish to the fallback topic answered (ntfy: 200 with the event as JSON)."""
    if status is None:
        return NtfyOutcome("retry", error or "no response")
    if 200 <= status < 300:
        return NtfyOutcome("sent", f"HTTP {status}", status)
    if status in (408, 429) or status >= 500:
        retry_after = backoff.parse_retry_after(
            headers.get("Retry-After") if headers else None, now
        )
        return NtfyOutcome("retry", _retry_detail(status, retry_after), status, retry_after)
    return NtfyOutcome("permanent", f"HTTP {status}: {_body_excerpt(body)}", status)


_LABEL = re.compile(r"[^a-z0-9_-]")


def ntfy_headers(kind: str, topic: str, token: str | None) -> dict[str, str]:
    """Headers for a fallback publish: title names the notice kind (or "triage")."""
    label = "triage" if kind == "triage" else (_LABEL.sub("", topic.lower())[:40] or "notice")
    if kind == "triage":
        priority, emoji = "4", "robot"
    elif label in LOSS_NOTICES:
        priority, emoji = "5", "rotating_light"
    else:
        priority, emoji = "4", "warning"
    headers = {
        "Title": f"ntfy-intake: {label}",
        "Priority": priority,
        "Tags": f"{emoji},ntfy-intake,{label}",
        "Content-Type": "text/plain; charset=utf-8",
    }
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def retry_delay(
    attempt: int, retry_after: float | None, rng: Callable[[], float], *, base: float
) -> float:
    return backoff.delay(attempt - 1, base=base, cap=RETRY_CAP, rng=rng, retry_after=retry_after)


# -- the store side ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim:
    key: str
    kind: str  # "notice" | "triage"
    topic: str  # the notice kind ("gap", "latch", ...) or "triage"
    text: str
    attempt: int
    channel: str | None  # "ntfy" once the row is routed to the fallback topic
    owed: tuple[str, ...] | None  # Signal recipients still owed; None = every configured one
    failing_since: float | None
    ntfy_attempts: int


def claim_due(conn: sqlite3.Connection, now: float, *, lease: float) -> Claim | None:
    """Lease the next due row (pending and due, or leased with its lease run out)."""
    with db.write_txn(conn):
        row = conn.execute(
            "UPDATE owner_outbox SET state = 'leased', lease_until = ?, attempts = attempts + 1"
            " WHERE key = (SELECT key FROM owner_outbox"
            "   WHERE (state = 'pending' AND due_at <= ?) OR (state = 'leased' AND lease_until <= ?)"
            "   ORDER BY due_at, created_at, key LIMIT 1)"
            " RETURNING key, kind, topic, text, attempts, channel, signal_owed,"
            "   signal_failing_since, ntfy_attempts",
            (now + lease, now, now),
        ).fetchone()
    if row is None:
        return None
    owed = None if row[6] is None else tuple(str(r) for r in json.loads(row[6]))
    return Claim(
        key=row[0],
        kind=row[1],
        topic=row[2],
        text=row[3],
        attempt=int(row[4]),
        channel=row[5],
        owed=owed,
        failing_since=None if row[7] is None else float(row[7]),
        ntfy_attempts=int(row[8]),
    )


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
        conn: sqlite3.Connection,
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
    ) -> None:
        self.conn = conn
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
        self.wakeup = asyncio.Event()
        self.stats = OwnerStats()
        # At most two sends per claim, each bounded by `timeout` (plus a second of slack).
        self.lease = 2 * (timeout + 1.0) + 5.0
        self._known = (*owner.recipients, *([owner.signal_number] if owner.signal_number else []))
        self._no_channel_logged = False

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
        while not stop.is_set():
            self.wakeup.clear()
            if await self.run_once():
                continue
            next_due = await self.run_db(outbox.next_due_at, self.conn, "owner_outbox")
            wait = 1.0 if next_due is None else min(1.0, max(0.0, next_due - self.clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=wait)

    async def run_once(self) -> bool:
        """Send every due row (up to a batch); True if any row was claimed."""
        claimed = 0
        while claimed < CLAIM_BATCH:
            claim = await self.run_db(claim_due, self.conn, self.clock(), lease=self.lease)
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
        if outcome.kind == "sent":
            return Settlement(
                "sent", [Leg("signal", "sent", status, detail, count)], "signal", sent_request=True
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
        )

    async def _ntfy_leg(self, claim: Claim, text: str, legs: list[Leg]) -> Settlement:
        assert self.owner.fallback_topic is not None
        headers = ntfy_headers(claim.kind, claim.topic, self.ntfy_token)
        status, answer_headers, content, error = await self._post(
            f"{self.ntfy_url}/{self.owner.fallback_topic}", text.encode("utf-8"), headers
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
        owed = None if settlement.owed is None else json.dumps(list(settlement.owed))
        with db.write_txn(self.conn):
            settled = (
                self.conn.execute(
                    "UPDATE owner_outbox SET state = ?, due_at = coalesce(?, due_at),"
                    " lease_until = NULL, channel = ?, last_error = ?, settled_at = ?,"
                    " signal_owed = ?, signal_failing_since = ?, ntfy_attempts = ?"
                    " WHERE key = ? AND state = 'leased' AND attempts = ?",
                    (
                        settlement.state,
                        settlement.due_at,
                        settlement.channel,
                        settlement.error,
                        None if settlement.state == "pending" else now,
                        None if settlement.state == "sent" else owed,
                        None if settlement.state == "sent" else settlement.failing_since,
                        max(settlement.ntfy_attempts, claim.ntfy_attempts),
                        claim.key,
                        claim.attempt,
                    ),
                ).rowcount
                == 1
            )
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
                    )
        if settled:
            self._count(claim, settlement)

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
