"""Push relay to the triage agent: claim due outbox rows, POST with no transaction open, settle.

At-least-once with a stable key: every retry of a row carries the same `Idempotency-Key`, and a
row is marked delivered only after the receiver answered 2xx. A crash after the POST and before
the settle re-sends the same key, which a deduplicating receiver answers with its original reply.

Each attempt is signed when it is sent (Standard Webhooks, `signing.py`) and has one total
deadline, connect + send + the whole response, which a receiver trickling bytes cannot stretch.
A 401 (a receiver whose clock is not synced yet, a secret being rotated) is retried with backoff
like a 5xx and noticed to the owner once per streak, never dead at once. A reply is made valid
UTF-8 where it is decoded: no value a receiver sends can stop the relay.

Up to `concurrency` attempts are in flight at once (4 by default), never two of one incident:
each incident's claimed rows go out one after another, oldest due first. Claims are made while
earlier attempts are still in flight; what finished is settled in one transaction per turn and
the audit flushed once for it: at once when the turn also claimed, else once no release came
within `FLUSH_GRACE` (a request released meanwhile is claimed first, so back-to-back alerts do
not each wait behind the last one's audit flush). A row the writer releases while the relay has
room is leased to it in the release's own transaction and handed over once committed (`room`,
`take`, outbox.ask_hand_off): its POST waits for no claim.

`classify()` and `retry_delay()` (wire/relay_outcome.py) are pure; `Relay` is the loop around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal

import httpx
import structlog

from ntfy_intake import __version__
from ntfy_intake.flow.relay_wakeup import Wakeup
from ntfy_intake.rules import cadence, notices
from ntfy_intake.store import audit, db, outbox
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.wire import http_post, relay_outcome, signing
from ntfy_intake.wire.relay_outcome import Outcome, RelayStats, classify, retry_delay

log = structlog.get_logger("ntfy_intake.relay")

RETRY_BASE = relay_outcome.RETRY_BASE  # callers name it relay.RETRY_BASE

CLAIM_BATCH = 16
CLAIMS_PER_LANE = 8  # a claim batch holds this many per connection, so none sits idle
DEFAULT_CONCURRENCY = 4  # deliveries in flight at once (to different incidents)
MAX_REPLY_BYTES = 1 << 20  # a larger reply is cut here: only its `notify.text` is ever used
# A settle's audit lines wait this long for a release to claim first (its POST then does not
# queue behind this flush), or for the next turn's claim, whichever comes first.
FLUSH_GRACE = 0.05
# The longest idle sleep with nothing due (issue 36; was a claim transaction each second): what
# bounds a redrive no nudge told of, from another host of a PostgreSQL cluster. A redrive on the
# daemon's host nudges it (relay_wakeup.nudge), a release or a due retry wakes it on time.
POLL_S = 30.0


class Relay:
    """The relay loop. `run` keeps up to `concurrency` attempts in flight and claims more as they
    settle; each turn claims what is due (no fsync), settles what finished in ONE transaction,
    then flushes the audit once. `run_once` is one claim, post, settle and flush, for tests and tools.

    Every claimed row waits in its incident's lane (a queue worked by one task, one attempt at a
    time): a row claimed while an earlier one of its incident is still queued or in flight goes
    out after it, never beside it. Claimed rows are held until they settle and are never claimed
    twice, even when their lease runs out while they wait their turn.
    """

    def __init__(
        self,
        conn: db.Connection,
        client: httpx.AsyncClient,
        *,
        run_db: db.Runner,
        owner_queue: OwnerQueue,
        url: str,
        timeout: float,
        max_attempts: int,
        clock: Callable[[], float],
        flush_audit: Callable[[], Awaitable[bool]],
        after_post: Callable[[], None] = lambda: None,
        rng: Callable[[], float] = random.random,
        retry_base: float = RETRY_BASE,
        signing_key: bytes | None = None,
        token: str | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        poster: http_post.KeepAlivePoster | None = None,
        may_act: Callable[[], bool] = lambda: True,
    ) -> None:
        if concurrency < 1:
            raise ValueError("relay concurrency must be at least 1")
        self.concurrency = concurrency
        self.conn = conn
        self.run_db = run_db
        self.owner_queue = owner_queue
        self.retry_base = retry_base
        self.client = client
        self.url = url
        # The lean keep-alive client when the daemon hands one over, else httpx.
        self.poster = poster
        self._send = poster.post if poster is not None else self._post
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.clock = clock
        self.flush_audit = flush_audit
        self.after_post = after_post
        # Asked right before each POST: False once this node's lease is over (DESIGN.md
        # section 9). The claim stays leased; the next leader releases and sends it.
        self.may_act = may_act
        self.rng = rng
        self.signing_key = signing_key
        self.token = token
        self.unauthorized_streak = False
        self.wakeup = Wakeup()
        self.stats = RelayStats()
        self.lease = timeout * 2 + 5.0
        self._timeout = {"timeout": httpx.Timeout(timeout).as_dict()}
        self._fixed_headers = {
            "Content-Type": "application/json",
            "User-Agent": f"ntfy-intake/{__version__}",
        }
        if token is not None:
            self._fixed_headers["Authorization"] = f"Bearer {token}"
        # Claimed rows held at most: enough that no connection waits for the next claim.
        self.window = max(CLAIM_BATCH, CLAIMS_PER_LANE * concurrency)
        self._slots = asyncio.Semaphore(concurrency)
        self._lanes: dict[str, deque[outbox.Claim]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._held: set[str] = set()  # claimed, not yet settled
        self._finished: list[tuple[outbox.Claim, Outcome]] = []
        self._stop: asyncio.Event | None = None  # run()'s: no attempt starts once it is set
        self._failure: BaseException | None = None
        # When the next row falls due, as the last claim or settle transaction left the outbox.
        self._next_due: float | None = None
        self._flush_owed = False  # settled, audit lines not yet flushed (`FLUSH_GRACE`)
        self._owed_since = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        if self.signing_key is None:
            log.warning(
                "relay.unsigned",
                detail="relay.secret is not set: deliveries are unsigned, so a receiver cannot "
                "tell them from forgeries (docs/triage-contract.md, section 5)",
            )
        self._stop = stop
        await self.run_db(outbox.release_leases, self.conn)
        look = True  # rows may be due: a claim is worth its query
        try:
            while not stop.is_set():
                self._raise_lane_failure()
                # Taken before looking, not after: a row released while we look (the writer sets
                # the wakeup from the event loop between our awaits) must not wait out the poll.
                if self.wakeup.is_set():
                    look = look or self.wakeup.look
                    self.wakeup.clear()
                # A turn (a claim, one settle transaction, one audit flush) when the lanes run dry
                # or half the window waits to be settled: not one per delivery under load, and
                # at once for a lone delivery.
                done = len(self._finished)
                unfinished = len(self._held) - done  # in flight, or waiting their turn
                want = self.window - unfinished
                running_dry = unfinished <= self.concurrency
                if (done and (running_dry or done >= self.window // 2)) or (look and running_dry):
                    claims = await self._turn(
                        self._take_finished(), want if look else 0, defer_flush=True
                    )
                    # Fewer than asked: nothing more is due until a release or a due time.
                    look = not running_dry or len(claims) == want
                    continue
                if self._flush_owed:
                    grace = self._owed_since + FLUSH_GRACE - time.monotonic()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wakeup.wait(), timeout=max(0.0, grace))
                    if self.wakeup.is_set() and grace > 0:
                        continue  # claimed first, flushed after (`_turn`)
                    await self._flush()
                # As the last transaction left the outbox (asked in it: no query of its own).
                due = self._next_due
                wait = POLL_S if due is None else min(POLL_S, max(0.0, due - self.clock()))
                if self._held:
                    # An attempt in flight sets the wakeup when it ends; the due time may be its
                    # own lease's, or a row of a busy incident: a second at least, as before.
                    wait = max(1.0, wait)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wakeup.wait(), timeout=wait)
                look = look or not self.wakeup.is_set()  # a due time, the poll; else as woken
        except BaseException:
            for task in self._tasks:  # a failure or a cancel: no attempt outlives the relay
                task.cancel()
            raise
        # Stopping: in-flight attempts finish (bounded by the timeout) and are settled; claimed
        # rows whose attempt never started go back to pending.
        await self._settle_in_flight()

    async def run_once(self) -> bool:
        """Claim a batch, POST it over at most `concurrency` connections, settle it in one
        transaction, flush the audit once. One incident's deliveries go out one after another
        in claim order (oldest due first): never two of them in flight, never reordered."""
        if not await self._turn([], self.window - len(self._held)):
            return False
        await self._settle_in_flight()
        return True

    async def _turn(
        self,
        finished: list[tuple[outbox.Claim, Outcome]],
        want: int,
        *,
        defer_flush: bool = False,
    ) -> list[outbox.Claim]:
        """Claim up to `want` due rows and start them, then settle `finished` and flush the
        audit. The claim goes first, in a transaction of its own without an fsync: a released
        row's POST never waits for the settle's fsync. Returns the new claims. `defer_flush`:
        a settle with no claim beside it leaves its flush owed (`FLUSH_GRACE`)."""
        claims: list[outbox.Claim] = []
        if want > 0:
            holding = tuple(self._held)  # finished rows too: still leased until settled
            claims = await self.run_db(self._settle_and_claim, [], want, holding, ())
            self._dispatch(claims)
        if finished:
            for claim, _ in finished:
                self._held.discard(claim.delivery_key)
            await self.run_db(self._settle_and_claim, finished, 0, (), ())
            # A delivery is marked only after its 2xx; a crash before this settle re-sends the
            # same keys (at-least-once, absorbed by the receiver's dedup).
            self._owe_flush()
        if self._flush_owed and (claims or not defer_flush):
            await self._flush()  # the claims' POSTs are out already
        return claims

    def room(self) -> outbox.HandOff | None:
        """The rows a release may lease to this relay in its own transaction (the writer's, via
        outbox.ask_hand_off): the window's free room while `run` runs, else none."""
        if self._stop is None or self._stopping():
            return None
        free = self.window - len(self._held)
        return outbox.HandOff(free, self.lease) if free > 0 else None

    def take(self, claims: list[outbox.Claim]) -> None:
        """Rows a release leased to this relay (`room`), committed: started as if claimed here,
        with no claim's round trip before their POST. Once stopping they are put back with the
        unstarted claims (`_settle_in_flight`), or by the next start's `release_leases`."""
        self._dispatch(claims)

    def wake(self) -> None:
        """Rows may be due (a release it was not handed, a redrive): the next turn claims."""
        self.wakeup.set()

    def _owe_flush(self) -> None:
        if not self._flush_owed:
            self._flush_owed, self._owed_since = True, time.monotonic()

    async def _flush(self) -> None:
        self._flush_owed = False
        await self.flush_audit()

    async def _settle_in_flight(self) -> None:
        """Wait for every lane to finish, then settle what it did (and put back what it never
        started, when stopping) in one transaction and flush the audit."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._raise_lane_failure()
        unstarted = [claim.delivery_key for queue in self._lanes.values() for claim in queue]
        self._lanes.clear()
        finished = self._take_finished()
        for key in unstarted:
            self._held.discard(key)
        for claim, _ in finished:
            self._held.discard(claim.delivery_key)
        if finished or unstarted:
            await self.run_db(self._settle_and_claim, finished, 0, (), tuple(unstarted))
            self._owe_flush()
        if self._flush_owed:
            await self._flush()

    def _stopping(self) -> bool:
        return (self._stop is not None and self._stop.is_set()) or not self.may_act()

    def _take_finished(self) -> list[tuple[outbox.Claim, Outcome]]:
        finished, self._finished = self._finished, []
        return finished

    def _raise_lane_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _dispatch(self, claims: list[outbox.Claim]) -> None:
        """Queue each claim behind its incident's earlier ones; start a lane where none runs."""
        for claim in claims:
            self._held.add(claim.delivery_key)
            lane_key = claim.incident_key or claim.delivery_key
            queue = self._lanes.get(lane_key)
            if queue is None:
                queue = self._lanes[lane_key] = deque()
                task = asyncio.create_task(self._lane(lane_key, queue), name="relay-lane")
                self._tasks.add(task)
                task.add_done_callback(self._lane_done)
            queue.append(claim)

    async def _lane(self, lane_key: str, queue: deque[outbox.Claim]) -> None:
        """One incident's claims, one attempt at a time, in the order they were claimed."""
        try:
            while queue and not self._stopping():
                async with self._slots:
                    if self._stopping():
                        break
                    claim = queue[0]
                    outcome = await self.attempt(claim)
                queue.popleft()
                self.after_post()
                self._finished.append((claim, outcome))
                self.wakeup.settle()
        finally:
            if not queue:
                del self._lanes[lane_key]

    def _lane_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()
            self.wakeup.settle()

    def headers_for(self, claim: outbox.Claim, body: bytes) -> dict[str, str]:
        """This attempt's headers, signed now (a retry carries a fresh timestamp)."""
        headers = {"Idempotency-Key": claim.delivery_key, **self._fixed_headers}
        if self.signing_key is not None:
            headers |= signing.sign(self.signing_key, claim.delivery_key, body, self.clock())
        return headers

    async def attempt(self, claim: outbox.Claim) -> Outcome:
        self.stats.attempts += 1
        body = claim.payload.encode()
        try:
            # One deadline for the whole attempt: httpx's timeouts are per read, so a receiver
            # sending a byte every few seconds would otherwise hold the attempt indefinitely.
            async with asyncio.timeout(self.timeout):
                status, headers, reply = await self._send(body, self.headers_for(claim, body))
        except TimeoutError:
            return classify(None, None, b"", f"timeout after {self.timeout:g}s", self.clock())
        except httpx.TimeoutException as exc:
            return classify(None, None, b"", f"timeout ({type(exc).__name__})", self.clock())
        except httpx.HTTPError as exc:
            return classify(None, None, b"", f"{type(exc).__name__}: {exc}", self.clock())
        return classify(status, headers, reply, None, self.clock())

    async def _post(self, body: bytes, headers: dict[str, str]) -> tuple[int, httpx.Headers, bytes]:
        # Built here rather than by `client.stream(...)`: no merging of the client's defaults,
        # cookies and params into every request (~5-10 % of the relay's CPU per delivery).
        request = httpx.Request(
            "POST", self.url, content=body, headers=headers, extensions=self._timeout
        )
        response = await self.client.send(request, stream=True)
        try:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size >= MAX_REPLY_BYTES:
                    break
            return response.status_code, response.headers, b"".join(chunks)[:MAX_REPLY_BYTES]
        finally:
            await response.aclose()

    def _settle_and_claim(
        self,
        settlements: list[tuple[outbox.Claim, Outcome]],
        want: int,
        holding: tuple[str, ...],
        unstarted: tuple[str, ...],
    ) -> list[outbox.Claim]:
        """Every finished attempt settled, unstarted claims put back and up to `want` due rows
        claimed, in ONE transaction (one fsync, not one per delivery).

        What the settle changes in memory (the owner queue's cadence state, the 401 streak, the
        counters) changes after COMMIT only: a transaction that failed and runs again (a
        transient storage fault) decides exactly as the first run did."""
        now = self.clock()
        # A claim alone commits without its own fsync: a lease lost to a power cut leaves the
        # row pending, to be sent again under the same key, which a lost lease does anyway (the
        # next start releases every lease). The next FULL commit makes it durable with the rest.
        # One fsync less between a release and its POST.
        claim_only = not settlements and not unstarted
        claims: Callable[[], list[outbox.Claim]] | None = None
        with (
            db.commits_without_fsync(self.conn) if claim_only else contextlib.nullcontext(),
            db.write_txn(self.conn) as txn,
        ):
            if settlements:
                # Owner decisions (the daily cap) see this batch's earlier ones; the live state
                # takes them after COMMIT. (No copy for a claim alone: it decides nothing.)
                work = self.owner_queue.fork_for(txn)
                streak = self.unauthorized_streak
                # Every row's settle first, their answers then (one wait on PostgreSQL), each
                # acted on in order as before.
                marks = [self._mark_for(claim, outcome, now) for claim, outcome in settlements]
                settled = outbox.settle_all(self.conn, [mark for _, mark in marks])
                for (claim, outcome), (result, _), done in zip(
                    settlements, marks, settled, strict=True
                ):
                    streak = self._settle_one(txn, claim, outcome, now, work, streak, result, done)
                txn.after_commit(lambda: setattr(self, "unauthorized_streak", streak))
            if unstarted:
                outbox.unclaim(self.conn, unstarted)
            if want > 0:
                # Read once committed (PostgreSQL: with the COMMIT's answer), never acted on
                # before: a claim alone is one round trip.
                claims = outbox.ask_lease(
                    self.conn, now, limit=want, lease=self.lease, holding=holding
                )
            next_due = outbox.ask_next_due(self.conn)  # for the idle wait in `run`
        self._next_due = next_due()
        return [] if claims is None else claims()

    def _mark_for(
        self, claim: outbox.Claim, outcome: Outcome, now: float
    ) -> tuple[Literal["delivered", "retry", "dead"], outbox.Mark]:
        """What an attempt settles its row as (pure but for the retry's jitter)."""
        key = claim.delivery_key
        if outcome.kind == "delivered":
            return "delivered", outbox.Mark.delivered(key, outcome.detail, now)
        if outcome.kind == "retry" and claim.attempt < self.max_attempts:
            due = now + retry_delay(
                claim.attempt, outcome.retry_after, self.rng, base=self.retry_base
            )
            return "retry", outbox.Mark.retry(key, due, outcome.detail)
        return "dead", outbox.Mark.dead(key, outcome.detail, now)

    def _settle_one(
        self,
        txn: db.Transaction,
        claim: outbox.Claim,
        outcome: Outcome,
        now: float,
        work: cadence.CadenceState,
        streak: bool,
        result: Literal["delivered", "retry", "dead"],
        settled: bool,
    ) -> bool:
        """Inside `txn`: what one attempt's settle (`result`, `settled`: the row was still
        leased and is now marked) leads to. `streak`: whether a 401 streak is running (its
        notice sent) as of the batch's earlier settlements; returns it after this one."""
        key = claim.delivery_key
        if not settled:
            return streak
        if result == "delivered" and outcome.notify_text is not None:
            # The agent's reply: one owner message per delivery key, under the cap.
            self.owner_queue.triage_message(
                txn, f"notify:{key}", outcome.notify_text, now, state=work
            )
        elif result == "retry" and outcome.status == 401 and not streak:
            self.owner_queue.notice(
                txn,
                notices.relay_unauthorized(key, claim.attempt, outcome.detail),
                now,
                state=work,
            )
        elif result == "dead":
            self.owner_queue.notice(
                txn, notices.dead_row(key, outcome.detail, claim.attempt), now, state=work
            )
        audit.stage(
            self.conn,
            "delivery",
            now,
            delivery_key=key,
            attempt=claim.attempt,
            result=result,
            status=outcome.status,
            detail=outcome.detail,
        )
        txn.after_commit(lambda: self._count(claim, outcome, result))
        # In order, inside the batch: a later 401 of it must see this streak's notice.
        if outcome.status == 401:
            return True
        return False if result == "delivered" else streak

    def _count(self, claim: outbox.Claim, outcome: Outcome, result: str) -> None:
        key = claim.delivery_key
        if result == "delivered":
            self.stats.delivered += 1
            log.info("relay.delivered", delivery_key=key, attempt=claim.attempt)
        elif result == "retry":
            self.stats.retries += 1
            log.warning("relay.retry_scheduled", delivery_key=key, detail=outcome.detail)
        else:
            self.stats.dead += 1
            log.error("relay.dead", delivery_key=key, detail=outcome.detail)
