"""The agent feed over HTTP: ``GET /v1/feed/<handle>``, ``POST /v1/feed/<handle>/ack`` and the
long poll ``GET /v1/feed/<handle>/wait`` (docs/http-api.md).

The feed is the same `FeedStore` the CLI uses, on the daemon's database file, opened on first use
and used from the thread pool. The long poll waits with `Doorbell.wait_async` (never a thread per
waiter) and ends with 503 once the server is stopping, or when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar, cast

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ntfy_intake.errors import FeedError
from ntfy_intake.store import db
from ntfy_intake.store.doorbell import Doorbell, WakeEvent
from ntfy_intake.store.feed import DEFAULT_CHANNEL, MAX_PAGE, Entry, FeedStore, JoinAt, check_name
from ntfy_intake.surfaces.http_requests import Reject, error, json_object, json_response

MAX_WAIT_S: Final = 300.0
DEFAULT_WAIT_S: Final = 30.0
DEFAULT_PAGE: Final = 100
MAX_ACK_BODY: Final = 4 * 1024

_STOP_POLL_S = 0.05

T = TypeVar("T")


class FeedRoutes:
    """The three feed endpoints of one app. `stopping` set: open long polls answer 503; at most
    `max_long_polls` are open at once (on the event loop only)."""

    def __init__(self, db_path: db.Target, stopping: threading.Event, max_long_polls: int) -> None:
        self._store = _LazyStore(db_path)
        self._stopping = stopping
        self._max_long_polls = max_long_polls
        self._long_polls = 0

    def close(self) -> None:
        self._store.close()

    async def read(self, request: Request) -> Response:
        handle = _name("handle", request.path_params["handle"])
        channel = _channel_param(request)
        at = _join_at(request)
        after = _int_param(request, "after", lo=0)
        limit = _int_param(request, "limit", lo=1, hi=MAX_PAGE)

        def read(store: FeedStore) -> list[Entry]:
            if after is None and limit is None:
                return store.catch_up(handle, channel=channel, at=at)
            name = channel or DEFAULT_CHANNEL
            store.subscribe(handle, name, at=at)
            return store.page(handle, name, after=after, limit=limit or DEFAULT_PAGE)

        entries = await self._store.run(read)
        return json_response(200, [entry.to_json() for entry in entries])

    async def ack(self, request: Request) -> Response:
        handle = _name("handle", request.path_params["handle"])
        body = await json_object(request, MAX_ACK_BODY)
        channel, seq = body.get("channel"), body.get("seq")
        if not isinstance(channel, str):
            raise Reject(400, "bad_channel", "channel must be a string")
        _name("channel", channel)
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise Reject(400, "bad_seq", "seq must be a non-negative integer")
        try:
            cursor = await self._store.run(lambda store: store.ack(handle, channel, seq))
        except FeedError as exc:
            text = str(exc)
            if "beyond head" in text:
                raise Reject(409, "beyond_head", text) from None
            if "has not joined" in text:
                raise Reject(409, "not_joined", text) from None
            raise Reject(400, "bad_request", text) from None
        return json_response(200, {"channel": channel, "cursor": cursor})

    async def wait(self, request: Request) -> Response:
        handle = _name("handle", request.path_params["handle"])
        channel = _channel_param(request)
        at = _join_at(request)
        timeout = _timeout_param(request)

        def arm(store: FeedStore) -> Doorbell:
            # Join first, as every first feed call does: a ring for a handle without a cursor
            # would otherwise be lost when its catch-up then joins at the (later) head.
            if channel is not None:
                store.subscribe(handle, channel, at=at)
            elif not store.cursors(handle):
                store.subscribe(handle, DEFAULT_CHANNEL, at=at)
            return Doorbell(store, handle, channels=None if channel is None else [channel])

        if self._stopping.is_set():
            return error(503, "shutting_down", "the server is stopping", Retry_After="1")
        if self._long_polls >= self._max_long_polls:
            return error(503, "busy", "too many open long polls; retry", Retry_After="1")
        self._long_polls += 1
        try:
            bell = await self._store.run(arm)
            outcome = await _race(bell.wait_async(timeout), self._stopping, request)
        finally:
            self._long_polls -= 1
        if isinstance(outcome, WakeEvent):
            return json_response(200, {"wake_line": outcome.wake_line})
        if outcome is None or outcome == "gone":
            return Response(status_code=204)
        return error(503, "shutting_down", "the server is stopping", Retry_After="1")


# -- the feed store, opened lazily on first use ---------------------------------------------------


class _LazyStore:
    """One `FeedStore` per app (its own lock serializes statements), used from the thread pool."""

    def __init__(self, db_path: db.Target) -> None:
        self._db_path = db_path
        self._store: FeedStore | None = None
        self._lock = threading.Lock()

    def _get(self) -> FeedStore:
        with self._lock:
            if self._store is None:
                self._store = FeedStore.open(self._db_path)
            return self._store

    async def run(self, call: Callable[[FeedStore], T]) -> T:
        return await run_in_threadpool(lambda: call(self._get()))

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()


# -- request parsing ------------------------------------------------------------------------------


def _name(kind: str, value: str) -> str:
    try:
        return check_name(kind, value)
    except FeedError as exc:
        raise Reject(400, f"bad_{kind}", str(exc)) from None


def _int_param(request: Request, name: str, *, lo: int, hi: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise Reject(400, f"bad_{name}", f"{name} must be a non-negative integer")
    value = int(raw)
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise Reject(400, f"bad_{name}", f"{name} must be {bound}")
    return value


def _join_at(request: Request) -> JoinAt:
    at = request.query_params.get("at", "head")
    if at not in ("head", "start"):
        raise Reject(400, "bad_at", "at must be 'head' or 'start'")
    return cast(JoinAt, at)


def _channel_param(request: Request) -> str | None:
    channel = request.query_params.get("channel")
    return None if channel is None else _name("channel", channel)


def _timeout_param(request: Request) -> float:
    raw = request.query_params.get("timeout")
    if raw is None:
        return DEFAULT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise Reject(400, "bad_timeout", "timeout must be a number of seconds >= 0")
    return min(value, MAX_WAIT_S)


# -- long-poll helpers ----------------------------------------------------------------------------


async def _race(
    wait: Coroutine[Any, Any, WakeEvent | None], stopping: threading.Event, request: Request
) -> WakeEvent | str | None:
    """The doorbell's outcome, or "stopping" / "gone" if the server stops or the client leaves.

    Cancelling the doorbell is always safe: it holds nothing and consumes nothing.
    """
    task = asyncio.ensure_future(wait)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_STOP_POLL_S)
            if done:
                return task.result()
            if stopping.is_set():
                return "stopping"
            if await request.is_disconnected():
                return "gone"
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
