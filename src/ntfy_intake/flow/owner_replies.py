"""Replies from the owner's phone over Signal (DESIGN.md section 13), `owner.receive = "poll"`.

The loop: ask signal-cli-rest-api `GET /v1/receive/<signal_number>` (normal/native mode), then
handle each envelope it returned in a write transaction of its own, then flush the audit log,
and only then ask again. The receive removes what it returns on the server, so what one call
returned is committed before the next call: a kill -9 between a receive and its commits costs at
most that one call's replies (the owner gets no confirmation and can send again;
docs/owner-messages.md says so).

One envelope, one transaction: its row in `owner_replies` (by source and envelope timestamp,
inserted first, so a replayed envelope finds it and changes nothing), its effect (an ack row, a
silence or silence_end audit record, as the console writes them), its `owner_reply` audit line
and the confirmation to the owner (an owner_outbox row outside the cadence: no daily cap). A
stranger's envelope is refused with one audit line naming the sender and nothing of its text.

Parsing and matching are rules/owner_replies.py's; the SQL is store/owner_replies.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog

from ntfy_intake.rules import notices, sanitize, silences
from ntfy_intake.rules import owner_replies as rules
from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import audit, db
from ntfy_intake.store import owner_replies as store
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.wire import jsonsafe

log = structlog.get_logger("ntfy_intake.owner_replies")

DETAIL_EVENTS = 3
MAX_ITEMS = 100  # per receive call: more is logged and still handled next round
# websocket mode: a ping every PING_EVERY seconds, and a connection whose pong does not come
# within PING_DEADLINE is closed and opened again. json-rpc mode may send nothing for days, so
# silence itself is no fault, but a peer that stopped answering pings is (a bot without pings
# went deaf for days on a half-open connection).
PING_EVERY = 20.0
PING_DEADLINE = 20.0


@dataclass(slots=True)
class ReplyStats:
    receives: int = 0
    receive_failures: int = 0
    envelopes: int = 0
    replayed: int = 0
    by_result: dict[str, int] = field(default_factory=dict)
    last_ok: float | None = None  # clock time of the last successful receive
    last_error: str | None = None


class OwnerReplies:
    def __init__(
        self,
        conn: db.Connection,
        client: httpx.AsyncClient,
        *,
        run_db: db.Runner,
        owner: OwnerSettings,
        queue: OwnerQueue,
        clock: Callable[[], float],
        flush_audit: Callable[[], Awaitable[bool]],
        wake_sender: Callable[[], None],
        status_line: Callable[[], str],
        timeout: float = 10.0,
        may_act: Callable[[], bool] = lambda: True,
        after_receive: Callable[[], None] = lambda: None,
        ping_every: float = PING_EVERY,
        ping_deadline: float = PING_DEADLINE,
    ) -> None:
        self.ping_every = ping_every
        self.ping_deadline = ping_deadline
        self.conn = conn
        self.client = client
        self.run_db = run_db
        self.owner = owner
        self.queue = queue
        self.clock = clock
        self.flush_audit = flush_audit
        self.wake_sender = wake_sender
        self.status_line = status_line
        self.timeout = timeout
        self.may_act = may_act
        # Test hook (the daemon's crash points): right after a receive returned replies, before
        # any of them is committed.
        self.after_receive = after_receive
        self.allowed = (*owner.recipients, *owner.reply_from)
        self.stats = ReplyStats()
        # The reply path's health: since when receiving has failed (or not yet succeeded), and
        # whether this episode's notice is queued.
        self.failing_since: float | None = None
        self.noticed = False
        # The episode whose dead notice went out and whose end the owner is owed (one
        # reply_path_recovered notice, keyed by the same episode).
        self.dead_episode: str | None = None
        self.recovered_owed: str | None = None

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set() and self.may_act():
            if self.owner.receive == "websocket":
                await self.listen(stop)
            else:
                await self.run_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.owner.receive_every)

    async def listen(self, stop: asyncio.Event) -> None:
        """websocket mode (json-rpc): one connection until it fails or `stop`; each frame is
        committed before the next is read. A failure counts as a failed receive (health)."""
        base = (self.owner.signal_url or "").rstrip("/")
        url = "ws" + base.removeprefix("http") + f"/v1/receive/{self.owner.signal_number}"
        self.stats.receives += 1
        # Imported here: the polling mode and every daemon without owner replies never load it
        # (docs/performance.md, Memory: peak RSS).
        import websockets  # noqa: PLC0415
        from websockets.asyncio.client import connect  # noqa: PLC0415

        try:
            async with connect(
                url,
                open_timeout=self.timeout,
                ping_interval=self.ping_every,
                ping_timeout=self.ping_deadline,
                # A peer that stopped answering will not answer a close either.
                close_timeout=self.ping_deadline,
                proxy=None,
            ) as ws:
                self._receive_ok()
                await self._maybe_recovered()
                # A quiet connection is a working one while its pings are answered: the
                # keepalive's latency changes with each pong, and then the path counts as
                # received (status and /metrics would otherwise age a healthy idle path).
                latency = ws.latency
                frame: asyncio.Future[Any] | None = None
                while not stop.is_set() and self.may_act():
                    if frame is None:
                        frame = asyncio.ensure_future(ws.recv())
                    stopped = asyncio.ensure_future(stop.wait())
                    try:
                        await asyncio.wait(
                            {frame, stopped},
                            timeout=self.ping_every,
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                    except BaseException:  # cancelled while waiting
                        frame.cancel()
                        raise
                    finally:
                        stopped.cancel()
                    if not frame.done():
                        if stop.is_set() or not self.may_act():  # stopped before a frame came
                            frame.cancel()
                            return
                        if ws.latency != latency:
                            latency = ws.latency
                            self._receive_ok()
                        continue
                    done, frame = frame, None
                    try:
                        text = done.result()
                        raw = (
                            text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
                        )
                        item = jsonsafe.loads(raw)
                    except ValueError:  # one bad frame is skipped, the connection kept
                        log.warning("owner_replies.bad_frame")
                        continue
                    await self.commit_items([item])
                    self._receive_ok()
        except (OSError, TimeoutError, ValueError, websockets.WebSocketException) as exc:
            self._receive_failed(exc)
            await self._maybe_dead()

    async def commit_items(self, items: list[object]) -> int:
        """Handle each item in its own transaction, then flush the audit log and wake the
        sender; the number that had an effect."""
        if items:
            self.after_receive()
        line = self.status_line() if items else ""
        done = 0
        for item in items:
            result = await self.run_db(self.handle, _unwrap(item), line)
            if result is not None:
                done += 1
                self.stats.by_result[result] = self.stats.by_result.get(result, 0) + 1
        if items:
            await self.flush_audit()
        if done:
            self.wake_sender()
        return done

    def _receive_ok(self) -> None:
        self.stats.last_ok = self.clock()
        self.stats.last_error = None
        if self.noticed and self.dead_episode is not None:
            self.recovered_owed = self.dead_episode
        self.failing_since, self.noticed = None, False

    def _receive_failed(self, exc: BaseException) -> None:
        self.stats.receive_failures += 1
        self.stats.last_error = sanitize.one_line(f"{type(exc).__name__}: {exc}", 200)
        log.warning("owner_replies.receive_failed", detail=self.stats.last_error)

    async def run_once(self) -> int:
        """One receive call and the commits of what it returned; the number of envelopes that
        had an effect (a replay or a skipped kind has none)."""
        items = await self._receive()
        if items is None:
            await self._maybe_dead()
            return 0
        await self._maybe_recovered()
        return await self.commit_items(items)

    async def _maybe_recovered(self) -> None:
        """A receive succeeded after this episode's dead notice: one notice that replies count
        again, over Signal (it works again; the fallback topic was for while it did not)."""
        episode, self.recovered_owed = self.recovered_owed, None
        if episode is None:
            return
        await self.run_db(self._queue_notice, notices.reply_path_recovered(episode), False)
        await self.flush_audit()
        self.wake_sender()

    async def _maybe_dead(self) -> None:
        now = self.clock()
        if self.failing_since is None:
            self.failing_since = now
        if self.noticed or now - self.failing_since < self.owner.receive_dead_after:
            return
        episode = datetime.fromtimestamp(self.failing_since, UTC).strftime("%Y%m%dT%H%M%SZ")
        notice = notices.reply_path_dead(
            self.owner.receive_dead_after, self.stats.last_error, episode
        )
        await self.run_db(self._queue_notice, notice)
        self.dead_episode = episode
        await self.flush_audit()
        self.noticed = True
        self.wake_sender()

    def _queue_notice(self, notice: notices.Notice, fallback: bool = True) -> None:
        with db.write_txn(self.conn) as txn:
            self.queue.notice(txn, notice, self.clock())
            if fallback and self.owner.fallback_topic:
                store.route_to_fallback(self.conn, notice.key)

    async def _receive(self) -> list[object] | None:
        url = f"{(self.owner.signal_url or '').rstrip('/')}/v1/receive/{self.owner.signal_number}"
        self.stats.receives += 1
        try:
            async with asyncio.timeout(self.timeout + 1.0):
                response = await self.client.get(url, timeout=self.timeout)
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            # Strings made valid UTF-8 and nesting bounded at this decode boundary: a lone
            # surrogate escape or a deep document must cost one reply, never the loop.
            items = jsonsafe.loads(response.content)
            if not isinstance(items, list):
                raise ValueError("not a JSON array")
        except (httpx.HTTPError, TimeoutError, ValueError) as exc:
            self._receive_failed(exc)
            return None
        self._receive_ok()
        if len(items) > MAX_ITEMS:
            log.warning("owner_replies.many", items=len(items))
        return items

    # -- one envelope, one transaction (database thread) --------------------------------------------

    def handle(self, item: object, status_line: str = "") -> str | None:
        """Record one received item with its effect; its result, or None (not a reply, or a
        replay)."""
        envelope = rules.parse_item(item)
        if envelope is None:
            return None
        self.stats.envelopes += 1
        now = self.clock()
        with db.write_txn(self.conn) as txn:
            if not rules.is_owner(envelope, self.allowed):
                if not store.claim(
                    self.conn, envelope.source, envelope.timestamp, now, "-", "refused"
                ):
                    self.stats.replayed += 1
                    return None
                audit.stage(
                    self.conn,
                    "owner_reply",
                    now,
                    result="refused",
                    source=envelope.source,
                    envelope_ts=envelope.timestamp,
                )
                txn.after_commit(lambda: log.warning("owner_replies.refused"))
                return "refused"
            command = rules.parse_command(envelope.text)
            if not store.claim(
                self.conn, envelope.source, envelope.timestamp, now, command.verb, "pending"
            ):
                self.stats.replayed += 1
                return None
            result, reply, fields = self._effect(txn, envelope, command, status_line, now)
            store.settle(self.conn, envelope.source, envelope.timestamp, result)
            recent = store.confirmations_since(self.conn, now - rules.CONFIRM_WINDOW)
            answered = recent < rules.CONFIRM_LIMIT
            audit.stage(
                self.conn,
                "owner_reply",
                now,
                command=command.verb,
                result=result,
                envelope_ts=envelope.timestamp,
                confirmed=answered,
                **fields,
            )
            if answered:
                store.queue_confirmation(self.conn, _reply_key(envelope), reply, now)
        return result

    def _effect(
        self,
        txn: db.Transaction,
        envelope: rules.Envelope,
        command: rules.Command,
        status_line: str,
        now: float,
    ) -> tuple[str, str, dict[str, Any]]:
        verb = command.verb
        if command.problem is not None:
            return "help", rules.confirmation("help", None, problem=command.problem), {}
        if verb == "help":
            return "help", rules.HELP, {}
        if verb == "status":
            return "status", rules.confirmation("status", None, line=status_line), {}
        conn = self.conn
        quoted = newest = None
        if envelope.quote_id is not None:
            quoted = store.message_for_signal_ts(conn, envelope.quote_id)
        else:
            newest = store.newest_incident_message(conn, now - rules.NEWEST_WITHIN)
        target = rules.match(
            envelope.quote_id,
            None if quoted is None else quoted[0],
            None if newest is None else newest[:2],
            now,
        )
        if target is None:
            problem = (
                "That quote is not one of my messages"
                if envelope.quote_id is not None
                else "No message of mine about an incident in the last hour to apply that to"
            )
            return "unmatched", rules.confirmation("help", None, problem=problem), {}
        # The firing the answered message showed (its incident's version when it went out).
        shown = None
        if quoted is not None and target.how == "quote":
            shown = quoted[1]
        elif newest is not None and target.how == "newest":
            shown = newest[2]
        fields: dict[str, Any] = {"key": target.key, "matched": target.how}
        result, reply = act(conn, self.queue, txn, command, now, fields, via="signal", shown=shown)
        return result, reply, fields


def act(
    conn: db.Connection,
    queue: OwnerQueue,
    txn: db.Transaction,
    command: rules.Command,
    now: float,
    fields: dict[str, Any],
    *,
    via: str,
    shown: int | None = None,
) -> tuple[str, str]:
    """The effect of `command` (ack, silence, unsilence, details) on the incident the owner
    message `fields["key"]` is about, in the caller's write transaction: (result, the words
    that confirm it). `fields` (the `owner_reply` audit line's) gains the incident and a
    silence's id. One effect for a Signal reply (`via` "signal") and a fallback-topic button
    ("button", flow/owner_buttons.py) alike.

    `shown`: the incident's version when the message went out, the firing it showed. An ack of
    a message whose firing is over (the incident fired again or its severity rose since) acts
    on nothing (`firing_over`, as the Ack button of such a message: the button judges its
    token's version before calling here): the owner acknowledges what he saw, never a firing
    he has not seen. A silence names the incident and acts whatever firing it is in."""
    verb = command.verb
    key = str(fields["key"])
    incident = store.incident_of(conn, key)
    state = None if incident is None else store.incident_state(conn, incident)
    if incident is None or state is None:
        problem = "That message is not about an incident"
        return "unmatched", rules.confirmation("help", None, problem=problem)
    fields["incident"] = incident
    over = rules.firing_over(shown, state[1], state[2])
    if verb == "ack":
        if over:
            quoted = fields.get("matched") == "quote"
            return "firing_over", rules.ack_refused(incident, "quote" if quoted else "newest")
        store.ack(conn, incident, state[2], now, about=key, via=via)
        return "acknowledged", rules.confirmation("ack", incident)
    if verb == "silence":
        assert command.span is not None  # parse_command gives silence a span or a problem
        silence_id = "sil_" + secrets.token_hex(6)
        until = now + command.span
        why = "Signal reply" if via == "signal" else "ntfy button"
        record = silences.silence_fields(silence_id, "incident", incident, until, why)
        queue.silence(txn, "silence", now, **record)
        fields["silence_id"] = silence_id
        words = rules.confirmation("silence", incident, until=_hhmm(until), fired_again=over)
        return "silenced", words
    if verb == "unsilence":
        ended = 0
        for held in queue.state.silences.active(now):
            if held.scope == "incident" and held.target == incident:
                queue.silence(txn, "silence_end", now, silence_id=held.silence_id)
                ended += 1
        result = "unsilenced" if ended else "not_silenced"
        return result, rules.confirmation("unsilence", incident, ended=ended)
    lines = [
        _event_line(t, s, raw) for t, s, raw in store.last_events(conn, incident, DETAIL_EVENTS)
    ]
    return "details", rules.confirmation("details", incident, lines=lines)


def _unwrap(item: object) -> object:
    """A json-rpc notification (`{"jsonrpc": "2.0", "method": "receive", "params": {...}}`, as
    some versions relay signal-cli's own) carries the usual item in `params`."""
    if isinstance(item, dict) and item.get("method") == "receive":
        return item.get("params")
    return item


def _reply_key(envelope: rules.Envelope) -> str:
    # Deterministic per envelope (a replay could never queue a second one anyway: the claim
    # stops it), and no phone number in the key: keys appear in the audit log.
    digest = hashlib.sha256(envelope.source.encode()).hexdigest()[:12]
    return f"reply:{digest}:{envelope.timestamp}"


def _hhmm(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _event_line(time_s: int, severity: int, raw: str) -> str:
    try:
        message = json.loads(raw)
    except ValueError:
        message = {}
    if not isinstance(message, dict):
        message = {}
    title = message.get("title") if isinstance(message.get("title"), str) else ""
    body = message.get("message") if isinstance(message.get("message"), str) else ""
    text = sanitize.one_line(f"{title}: {body}" if title else str(body), 120)
    when = datetime.fromtimestamp(time_s, UTC).strftime("%H:%M")
    return f"{when} sev {severity} {text}"
