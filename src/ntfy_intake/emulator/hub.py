"""The emulator's shared state: cache, subscriptions, fan-out, limiters and the subscribe log.

Thread-safe: one re-entrant lock guards everything here, so `publish` may be called from any thread
while the server runs on its own event loop. Invariants owned here:
- registering a subscription and taking its replay happen under the lock, and so do caching a
  published message and choosing who gets it live: by default a message is delivered either live
  or in the replay, never both and never neither (the races are injected, see faults.py);
- live deliveries are handed to the server loop with call_soon_threadsafe, in publish order;
- a stream appears once per listed topic, so `/a,a/json` gets every message twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ntfy_intake.emulator.access import FixedLimiter, TokenBucket
from ntfy_intake.emulator.cache import MessageCache, Row
from ntfy_intake.emulator.config import EmulatorConfig
from ntfy_intake.emulator.faults import Delivery, Faults
from ntfy_intake.emulator.since import Since
from ntfy_intake.emulator.stream import Signal, Stream
from ntfy_intake.emulator.wire import Event

_AUTH_FAILURE_BURST = 30
_AUTH_FAILURE_EVERY = 60.0


class Hub:
    """Everything the HTTP layer and the programmatic API share."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.cache = MessageCache(enabled=config.cache_duration > 0)
        self.faults = Faults(self)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._clock: Callable[[], float] = config.clock
        self._offset = 0.0
        self._topics: dict[str, list[Stream]] = {}
        self._streams: dict[Stream, None] = {}
        self._log: list[dict[str, Any]] = []
        self._requests: dict[str, TokenBucket] = {}
        self._subscriptions: dict[str, FixedLimiter] = {}
        self._auth_failures: dict[str, TokenBucket] = {}
        self.published_count = 0  # ntfy's s.messages: every successful publish
        self._published_history = [0]  # sampled on every manager run, for /v1/stats
        self._visitor_messages: dict[str, int] = {}  # per visitor, for /v1/account

    # -- time -----------------------------------------------------------------------------------
    def now(self) -> float:
        with self.lock:
            return self._clock() + self._offset

    def now_s(self) -> int:
        return math.floor(self.now())

    def now_ns(self) -> int:
        now = self.now()
        seconds = math.floor(now)
        return seconds * 1_000_000_000 + round((now - seconds) * 1e9)

    def set_clock(self, clock: Callable[[], float]) -> None:
        with self.lock:
            self._clock = clock
            self._offset = 0.0

    def advance(self, seconds: float) -> None:
        with self.lock:
            self._offset += seconds

    # -- publishing -----------------------------------------------------------------------------
    def publish(self, event: Event, *, cache: bool, delayed: bool = False) -> Event:
        """Deliver live to whoever is subscribed now, then cache (ntfy's order, atomically).

        A delayed message is only cached (unpublished); `send_delayed` delivers it when due."""
        with self.lock:
            self.published_count += 1
            if delayed:
                self.cache.add(event, published=False)
                return event
            targets = tuple(self._topics.get(event.topic, ()))
            deliveries = self.faults.route_live(event, targets)
            if cache:
                self.faults.cache_add(event)
            self.schedule(deliveries)
        return event

    def send_delayed(self) -> list[str]:
        """ntfy's delayed sender: publish every scheduled message that has fallen due (by the
        injected clock) live, in (time, insertion) order, and mark it published."""
        with self.lock:
            sent = []
            for row in self.cache.due(self.now_s()):
                self.cache.mark_published(row)
                targets = tuple(self._topics.get(row.event.topic, ()))
                self.schedule(self.faults.route_live(row.event, targets))
                sent.append(row.event.id)
            return sent

    def manage(self) -> None:
        """ntfy's manager run: prune, then sample the message counter for /v1/stats."""
        self.prune()
        self.sample_stats()

    def sample_stats(self) -> None:
        """The manager's stats sample (ntfy keeps the last 10)."""
        with self.lock:
            self._published_history = [*self._published_history, self.published_count][-10:]

    def count_visitor_message(self, visitor: str) -> None:
        """ntfy counts a visitor's messages only when its request limiter applies (exempt
        hosts are not counted); request_limit=False is the emulator's "exempt"."""
        if not self.config.request_limit:
            return
        with self.lock:
            self._visitor_messages[visitor] = self._visitor_messages.get(visitor, 0) + 1

    def visitor_messages(self, visitor: str) -> int:
        with self.lock:
            return self._visitor_messages.get(visitor, 0)

    def stats(self, manager_interval: float) -> dict[str, Any]:
        """GET /v1/stats: messages published since start, and messages per second over the
        sampled history."""
        with self.lock:
            history = self._published_history
            rate = 0.0
            if len(history) > 1:
                rate = (history[-1] - history[0]) / ((len(history) - 1) * manager_interval)
            return {"messages": self.published_count, "messages_rate": rate}

    def schedule(self, deliveries: Iterable[Delivery]) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        for delivery in deliveries:
            with contextlib.suppress(RuntimeError):  # the loop closed under us: nobody listens
                if delivery.delay <= 0:
                    loop.call_soon_threadsafe(_deliver_all, delivery.event, delivery.targets)
                else:
                    loop.call_soon_threadsafe(
                        loop.call_later,
                        delivery.delay,
                        _deliver_all,
                        delivery.event,
                        delivery.targets,
                    )

    # -- subscriptions --------------------------------------------------------------------------
    def open_stream(
        self, stream: Stream, since: Since
    ) -> tuple[list[Event], Event | None, float | None]:
        """Register (unless polling) and take the replay in one step; returns the replay, the
        message to send twice when the duplicate fault fires, and the `replay_after_live` wait
        (None: send the replay now)."""
        with self.lock:
            stream.zombie = self.faults.is_silenced()
            if not stream.poll:
                for topic in stream.topics:
                    self._topics.setdefault(topic, []).append(stream)
            self._streams[stream] = None
            rows = self.take_replay(stream, since)
            duplicate = None
            passing = [row for row in rows if stream.filters.passes(row.event.to_dict())]
            if not stream.poll and passing and self.faults.take_duplicate():
                duplicate = max(passing, key=lambda row: row.rowid).event
            defer = None if stream.poll else self.faults.take_replay_after_live()
            self.changed.notify_all()
            return [row.event for row in rows], duplicate, defer

    def take_replay(self, stream: Stream, since: Since) -> list[Row]:
        """The cache query of a subscribe (after any lagging writes that have come due)."""
        with self.lock:
            self.faults.flush_due_cache_writes()
            rows = self.cache.replay(stream.topics, since, scheduled=stream.scheduled)
            return self.faults.visible_replay(rows, topics=len(stream.topics))

    def close_stream(self, stream: Stream) -> None:
        with self.lock:
            self._unregister(stream)
            self._streams.pop(stream, None)
            self.changed.notify_all()

    def _unregister(self, stream: Stream) -> None:
        stream.closed = True
        for topic in stream.topics:
            subscribers = self._topics.get(topic, [])
            while stream in subscribers:
                subscribers.remove(stream)

    def drop_streams(self, *, graceful: bool = False) -> int:
        """Stop live delivery to every open stream at once, then tell each to end."""
        with self.lock:
            streams = list(self._streams)
            for stream in streams:
                self._unregister(stream)
        loop = self.loop
        signal = Signal.CLOSE if graceful else Signal.DROP
        if loop is not None and not loop.is_closed():
            for stream in streams:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(stream.signal, signal)
        return len(streams)

    def abort_streams(self) -> None:
        """Server stop: every open connection is cut."""
        self.drop_streams()

    def inject_raw(self, data: bytes) -> int:
        """Write `data` as-is to every open stream (not polls); returns how many got it."""
        with self.lock:
            streams = [stream for stream in self._streams if not stream.poll and not stream.closed]
        loop = self.loop
        if loop is None or loop.is_closed():
            return 0
        for stream in streams:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stream.queue.put_nowait, data)
        return len(streams)

    def zombify_streams(self) -> None:
        with self.lock:
            for stream in self._streams:
                stream.zombie = True

    def subscriber_count(self, topic: str | None = None) -> int:
        """Open streams (polls excluded), or streams listening on one topic."""
        with self.lock:
            if topic is None:
                return sum(1 for stream in self._streams if not stream.poll)
            return len(set(self._topics.get(topic, ())))

    # -- the cache ------------------------------------------------------------------------------
    def prune(self) -> list[str]:
        """ntfy's manager run: delete messages whose `expires <= now`."""
        with self.lock:
            self.faults.flush_due_cache_writes()
            return self.cache.remove(self.cache.expired(self.now_s()))

    def evict(self, ids: Iterable[str] | None) -> list[str]:
        with self.lock:
            return self.cache.remove(ids)

    def messages(self, topic: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            self.faults.flush_due_cache_writes()
            return [row.event.to_dict() for row in self.cache.rows(topic)]

    # -- limiters (keyed by visitor, i.e. client IP) -------------------------------------------
    def allow_request(self, visitor: str) -> bool:
        if not self.config.request_limit:
            return True
        with self.lock:
            bucket = self._requests.setdefault(
                visitor,
                TokenBucket(
                    self.config.request_limit_burst, self.config.request_limit_replenish, self.now()
                ),
            )
            return bucket.allow(self.now())

    def acquire_subscription(self, visitor: str) -> bool:
        limit = self.config.subscription_limit
        if limit is None:
            return True
        with self.lock:
            return self._subscriptions.setdefault(visitor, FixedLimiter(limit)).allow()

    def release_subscription(self, visitor: str) -> None:
        with self.lock:
            if visitor in self._subscriptions:
                self._subscriptions[visitor].release()

    def auth_allowed(self, visitor: str) -> bool:
        if not self.config.auth_failure_limit:
            return True
        with self.lock:
            return self._auth_bucket(visitor).tokens(self.now()) >= 1.0

    def auth_failed(self, visitor: str) -> None:
        if self.config.auth_failure_limit:
            with self.lock:
                self._auth_bucket(visitor).allow(self.now())

    def _auth_bucket(self, visitor: str) -> TokenBucket:
        return self._auth_failures.setdefault(
            visitor, TokenBucket(_AUTH_FAILURE_BURST, _AUTH_FAILURE_EVERY, self.now())
        )

    # -- the subscribe log ----------------------------------------------------------------------
    def log_subscribe(self, entry: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self._log.append(entry)
            self.changed.notify_all()
            return entry

    def update_log(self, entry: dict[str, Any], **fields: Any) -> None:
        with self.lock:
            entry.update(fields)

    def subscribe_log(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(entry, params=dict(entry["params"])) for entry in self._log]


def _deliver_all(event: Event, targets: tuple[Stream, ...]) -> None:
    for stream in targets:
        stream.deliver_live(event)
