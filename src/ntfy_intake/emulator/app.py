"""The HTTP surface: ntfy's routes, in ntfy's order of checks, as a raw ASGI application.

Raw ASGI (no framework router) because the emulator must control every byte and, for the drop
fault, reach the connection under a response. Invariants owned here (ntfy-spec.md section 1.2):
- the order in which errors win: injected subscribe failures, then authentication (500 50001,
  429 42909, 401 40101), routing (404 40401), the request bucket (429 42901), topic read access
  (400 40009, then 403 40301), the subscription limit (429 42903), topics (400 40009), parameters
  (400 40008 / 40007);
- every error body is ntfy's JSON with `Content-Type: application/json` (a bare status on a
  WebSocket handshake, see exchange.py);
- the routes of ntfy 2.16+ (`/<topic>/<sequence_id>`, its DELETE and `/clear|read`) exist only
  with `ntfy_version="2.17"`; `/v1/...` is never a topic;
- the lifespan runs ntfy's background jobs: the manager (prune, stats sample) and the delayed
  sender;
- the emulator-only admin routes (admin.py) are matched first and skip auth and limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from typing import Any

from ntfy_intake.emulator import access, account, admin, publish, wire
from ntfy_intake.emulator.exchange import Exchange, Receive, Scope, Send, WebSocketExchange
from ntfy_intake.emulator.hub import Hub
from ntfy_intake.emulator.params import Params, parse_query_filters
from ntfy_intake.emulator.session import StreamSession, encoder
from ntfy_intake.emulator.since import InvalidSince, parse_since
from ntfy_intake.emulator.stream import Stream
from ntfy_intake.emulator.websocket import WebSocketSession
from ntfy_intake.emulator.wire import NtfyError

_T = r"[-_A-Za-z0-9]{1,64}"
TOPIC_PATH = re.compile(rf"/({_T})", re.ASCII)
PUBLISH_PATH = re.compile(rf"/({_T})/(?:publish|send|trigger)", re.ASCII)
WEB_PATH = re.compile(r"/docs(?:/.*)?|/static/.+", re.DOTALL)  # web app routes, off here
SUBSCRIBE_PATH = re.compile(rf"/({_T}(?:,{_T})*)/(json|sse|raw|ws|auth)", re.ASCII)
SEQUENCE_PATH = re.compile(rf"/({_T})/({_T})", re.ASCII)  # ntfy 2.16+: /<topic>/<sequence_id>
SEQUENCE_ACTION_PATH = re.compile(rf"/({_T})/({_T})/(clear|read)", re.ASCII)
_log = logging.getLogger(__name__)


class EmulatorApp:
    """The ASGI callable."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(self.hub, receive, send)
            return
        if scope["type"] == "websocket":
            if (await receive())["type"] != "websocket.connect":
                return
            exchange: Exchange = WebSocketExchange(self.hub, scope, receive, send)
        elif scope["type"] == "http":
            exchange = Exchange(self.hub, scope, receive, send)
        else:
            return
        try:
            await self._handle(exchange)
        except NtfyError as error:
            if not exchange.started:
                await exchange.fail(error)
        except Exception:
            if exchange.started:
                raise  # mid-stream: let the server cut the connection
            # ntfy answers any error that is not one of its own with 500, code 50001.
            _log.exception("emulator.request_failed", extra={"path": exchange.path})
            await exchange.fail(wire.INTERNAL_ERROR)

    async def _handle(self, ex: Exchange) -> None:
        config = self.hub.config
        if config.admin and ex.path.startswith(admin.PREFIX):
            await admin.handle(ex)
            return
        subscribe = None
        if ex.method == "GET" and WEB_PATH.fullmatch(ex.path) is None:
            subscribe = SUBSCRIBE_PATH.fullmatch(ex.path)
        if subscribe is not None and subscribe.group(2) != "auth":
            ex.log_entry = self.hub.log_subscribe(_log_entry(ex, self.hub.now()))
            since = ex.params.get("x-since", "since", "si")
            failure = self.hub.faults.take_subscribe_failure(
                carries_cursor=since not in ("", "all", "none", "latest")
            )
            if failure is not None:
                self.hub.update_log(ex.log_entry, fault=failure.name)
                await ex.fail(failure.error, failure.retry_after)
                return
        readable = self._authenticate(ex)
        sequences = config.sequences
        if ex.websocket and (subscribe is None or subscribe.group(2) != "ws"):
            raise wire.NOT_FOUND  # the emulator speaks WebSocket on /<topics>/ws only
        if ex.method == "GET" and ex.path == "/v1/health":
            await ex.respond_json({"healthy": True})
        elif ex.method == "GET" and ex.path == "/v1/account":
            await ex.respond_json(account.anonymous_account(self.hub, ex.visitor))
        elif ex.method == "GET" and ex.path == "/v1/stats":
            interval = config.manager_interval or 60.0
            await ex.respond_json(self.hub.stats(interval))
        elif ex.method == "OPTIONS":
            self._limit(ex)
            await ex.respond(
                200,
                b"",
                "",  # ntfy sends no Content-Type here
                (
                    (b"access-control-allow-methods", b"GET, PUT, POST, PATCH, DELETE"),
                    (b"access-control-allow-headers", b"*"),
                ),
            )
        elif ex.method in ("PUT", "POST") and ex.path == "/":
            topic, headers, body = publish.parse_json_publish(
                await ex.body(), config.message_size_limit
            )
            await self._publish(ex, topic, ex.params.with_headers(headers), body)
        elif target := _publish_topic(ex.method, ex.path):
            await self._publish(ex, target, ex.params, await ex.body())
        elif subscribe is not None:
            await self._subscribe(ex, subscribe.group(1), subscribe.group(2), readable)
        elif sequences and ex.method in ("PUT", "POST") and (match := _sequence(ex.path)):
            await self._publish(ex, match.group(1), ex.params, await ex.body(), match.group(2))
        elif sequences and ex.method == "DELETE" and (match := _sequence(ex.path)):
            await self._sequence_event(ex, match.group(1), match.group(2), wire.MESSAGE_DELETE)
        elif sequences and ex.method == "PUT" and (match := _sequence(ex.path, action=True)):
            await self._sequence_event(ex, match.group(1), match.group(2), wire.MESSAGE_CLEAR)
        else:
            raise wire.NOT_FOUND

    def _authenticate(self, ex: Exchange) -> tuple[str, ...] | None:
        """maybeAuthenticate: None when auth is off, else the readable topic patterns."""
        tokens = self.hub.config.tokens
        if tokens is None:
            return None
        header = access.read_auth_header(ex.params)
        if not access.supported_auth_header(header):
            return ()
        if not self.hub.auth_allowed(ex.visitor):
            raise wire.TOO_MANY_AUTH_FAILURES
        try:
            return access.authenticate(header, tokens)
        except NtfyError:
            self.hub.auth_failed(ex.visitor)
            raise

    def _limit(self, ex: Exchange) -> None:
        if not self.hub.allow_request(ex.visitor):
            raise wire.TOO_MANY_REQUESTS

    async def _publish(
        self, ex: Exchange, topic: str, params: Params, body: bytes, sequence_id: str = ""
    ) -> None:
        if topic in publish.DISALLOWED_TOPICS:
            raise wire.TOPIC_DISALLOWED
        self._limit(ex)
        config = self.hub.config
        built = publish.build_event(
            topic,
            params,
            body,
            now_ns=self.hub.now_ns(),
            cache_duration=config.cache_duration,
            size_limit=config.message_size_limit,
            sequences=config.sequences,
            sequence_id=sequence_id,
        )
        event = self.hub.publish(built.event, cache=built.cache, delayed=built.delayed)
        self.hub.count_visitor_message(ex.visitor)
        await ex.respond(200, event.line())

    async def _sequence_event(self, ex: Exchange, topic: str, sequence_id: str, kind: str) -> None:
        """ntfy 2.16+: DELETE /<topic>/<seq> and PUT /<topic>/<seq>/clear|read publish a cached
        `message_delete`/`message_clear` event carrying the sequence id."""
        if topic in publish.DISALLOWED_TOPICS:
            raise wire.TOPIC_DISALLOWED
        self._limit(ex)
        now = self.hub.now_s()
        event = wire.Event(
            id=wire.new_id(),
            time=now,
            event=kind,
            topic=topic,
            expires=int(now + self.hub.config.cache_duration),
            sequence_id=sequence_id,
        )
        self.hub.publish(event, cache=True)
        self.hub.count_visitor_message(ex.visitor)
        await ex.respond(200, event.line())

    async def _subscribe(
        self, ex: Exchange, topics_str: str, kind: str, readable: tuple[str, ...] | None
    ) -> None:
        topics = topics_str.split(",")
        self._limit(ex)
        if readable is not None:
            _check_topics(topics)
            if not all(access.can_read(readable, topic) for topic in topics):
                raise wire.FORBIDDEN
        if kind == "auth":
            await ex.respond_json({"success": True})
            return
        if kind == "ws" and not ex.websocket:
            raise wire.WEBSOCKET_UPGRADE_MISSING
        if not self.hub.acquire_subscription(ex.visitor):
            raise wire.TOO_MANY_SUBSCRIPTIONS
        try:
            _check_topics(topics)
            poll = ex.params.get_bool(False, "x-poll", "poll", "po")
            try:
                since = parse_since(
                    ex.params.get("x-since", "since", "si"), poll=poll, now_ns=self.hub.now_ns()
                )
            except InvalidSince:
                raise wire.SINCE_INVALID from None
            try:
                filters = parse_query_filters(ex.params)
            except ValueError:
                raise wire.PRIORITY_INVALID from None
            stream = Stream(
                topics=topics,
                topics_str=topics_str,
                filters=filters,
                poll=poll,
                encode=encoder(kind),
                scheduled=ex.params.get_bool(False, "x-scheduled", "scheduled", "sched"),
            )
            session = WebSocketSession if kind == "ws" else StreamSession
            await session(ex, self.hub, stream, kind).run(since)
        finally:
            self.hub.release_subscription(ex.visitor)


def _publish_topic(method: str, path: str) -> str | None:
    """`PUT|POST /<topic>` or `GET /<topic>/publish|send|trigger`."""
    if method in ("PUT", "POST") and (match := TOPIC_PATH.fullmatch(path)):
        return match.group(1)
    if method == "GET" and (match := PUBLISH_PATH.fullmatch(path)):
        return match.group(1)
    return None


def _sequence(path: str, *, action: bool = False) -> re.Match[str] | None:
    """`/<topic>/<sequence_id>` (or `.../clear|read`) on a topic that may be published to
    (`/v1/...` stays a 404)."""
    match = (SEQUENCE_ACTION_PATH if action else SEQUENCE_PATH).fullmatch(path)
    if match is None or match.group(1) in publish.DISALLOWED_TOPICS:
        return None
    return match


def _check_topics(topics: list[str]) -> None:
    """topicsFromPath: a disallowed name is reported as 40009 on subscribe paths."""
    if any(topic in publish.DISALLOWED_TOPICS for topic in topics):
        raise wire.TOPIC_INVALID


def _log_entry(ex: Exchange, now: float) -> dict[str, Any]:
    params = ex.params
    effective = {
        "since": params.get("x-since", "since", "si"),
        "poll": params.get_bool(False, "x-poll", "poll", "po"),
        "id": params.get("x-id", "id"),
        "message": params.get("x-message", "message", "m"),
        "title": params.get("x-title", "title", "t"),
        "priority": params.get("x-priority", "priority", "prio", "p"),
        "tags": params.get("x-tags", "tags", "tag", "ta"),
        "scheduled": params.get_bool(False, "x-scheduled", "scheduled", "sched"),
    }
    return {
        "time": now,
        "path": ex.path,
        "query": params.query_items(),
        "params": {key: value for key, value in effective.items() if value},
        "auth": params.has_header("authorization")
        or params.query("auth") is not None
        or params.query("authorization") is not None,
        "status": None,
        "code": None,
        "fault": None,
    }


async def _lifespan(hub: Hub, receive: Receive, send: Send) -> None:
    """Attach the hub to the serving loop and run ntfy's manager (pruning) while it serves."""
    manager: asyncio.Task[None] | None = None
    try:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                hub.loop = asyncio.get_running_loop()
                manager = asyncio.create_task(_background(hub))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                hub.abort_streams()
                await send({"type": "lifespan.shutdown.complete"})
                return
    finally:
        if manager is not None:
            manager.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await manager
        hub.loop = None


async def _background(hub: Hub) -> None:
    async with asyncio.TaskGroup() as group:
        group.create_task(_every(hub.config.manager_interval, hub.manage))
        group.create_task(_every(hub.config.delayed_sender_interval, hub.send_delayed))


async def _every(interval: float | None, work: Callable[[], object]) -> None:
    if interval is None:
        return
    while True:
        await asyncio.sleep(interval)
        work()
