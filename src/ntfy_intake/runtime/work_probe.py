"""The readiness probe's two questions to the outside (runtime/readiness calls them): can this
node reach ITS ntfy, and is that ntfy the leader's; can it reach the relay. Each answer is None
(yes) or the not-ready reason, never holding a credential.

ntfy (one `poll=1` GET for its topics, with its credentials):
- 2xx is reachable. When the store's cursor names a message the leader recorded (an id, and
  its ntfy time), the poll asks `since=<that time - SINCE_MARGIN>` (inclusive, by time: ntfy's
  `since=<id>` falls back to everything for an id it lacks, so it cannot tell) and the id must
  be among the answer: a second ntfy behind the same URL text (ntfy on each box, the one config
  naming 127.0.0.1) answers 200 to everything and holds none of the leader's messages. With no
  id recorded yet, or one older than `ntfy.cache_duration` less EXPIRY_MARGIN (ntfy may have
  dropped it), the check cannot be made: reachable counts as ready, and the log says so once;
- a refusal of the credentials (401, 403, 429 42909) backs the probe off (rules/probe_backoff):
  ntfy's failed-login budget is per address and shared with the leader behind one NAT. While it
  waits no request goes out and the reason stays, naming when the next try is;
- any other 429 is the request bucket: ready (the route, server and credentials work).
relay (when `relay.url` is set): a HEAD to the relay URL's origin (`/`), no credential sent:
any HTTP answer is reachable (a 405 from a POST-only receiver, a 401 from one that wants its
token, a 501 from one without HEAD); no answer, a timeout, or a 502/503/504 (a proxy with
nothing behind it) is not.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import httpx
import structlog

from ntfy_intake.rules import probe_backoff, readiness
from ntfy_intake.settings import Settings
from ntfy_intake.store.cursor import Cursor
from ntfy_intake.wire import diagnose

log = structlog.get_logger("ntfy_intake.readiness")

SINCE_MARGIN = 5  # seconds before the leader's message time: two clocks, one server's seconds
# What a proxy says when nothing answers behind it; any other status is the relay's own answer
# (a 501 from a receiver that does not implement HEAD, a 405 from one that wants POST only).
PROXY_FAILURES = frozenset({502, 503, 504})
EXPIRY_MARGIN = 300.0  # ntfy prunes on its own schedule; a message this close to expiry may be gone


def relay_target(url: str) -> str:
    """The relay URL's origin, as the probe asks it: no userinfo, query or fragment (they may
    hold a credential), and not its path (a HEAD there may count as a delivery attempt to a
    receiver that logs every request; reachability is the host's, any answer will do)."""
    parts = urlsplit(url.strip())
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, "/", "", ""))


def message_ids(body: str) -> set[str]:
    """The ids of the message events in a poll's newline-delimited JSON."""
    ids: set[str] = set()
    for line in body.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("event") == "message" and "id" in obj:
            ids.add(str(obj["id"]))
    return ids


class WorkProbe:
    """This node's ntfy and relay probes (module doc); holds the refusal backoff between probes."""

    def __init__(
        self,
        settings: Settings,
        node: str,
        budget: float,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.node = node
        self.budget = budget
        self.backoff = probe_backoff.Backoff()
        # The store's cursor as the last probe read it (runtime/readiness sets it).
        self.leader_last: Cursor | None = None
        self._refused: str | None = None
        self._unchecked_told = False
        self._transport = transport
        self._monotonic = monotonic
        self._wall = wall

    async def check(self, *, ntfy: bool) -> str | None:
        """Both probes at once; their reasons joined, or None."""
        asks = [self.ntfy()] if ntfy else []
        if self.settings.relay.url:
            asks.append(self.relay(self.settings.relay.url))
        found = await asyncio.gather(*asks)
        return "; ".join(r for r in found if r) or None

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self._transport, timeout=self.budget)

    def _since(self) -> tuple[str, str | None]:
        """The poll's `since`, and the leader's message id it must find (None: not checkable)."""
        last = self.leader_last
        if last is None or last.kind != "id" or last.message_time is None:
            self._tell_unchecked("the leader has recorded no message yet")
            return "latest", None
        keep = self.settings.ntfy.cache_duration - EXPIRY_MARGIN
        if self._wall() - last.message_time > keep:
            self._tell_unchecked("the leader's last message may have left ntfy's cache")
            return "latest", None
        self._unchecked_told = False
        return str(max(2, last.message_time - SINCE_MARGIN)), last.value

    def _tell_unchecked(self, why: str) -> None:
        if not self._unchecked_told:
            log.info("readiness.ntfy_identity_unchecked", node=self.node, why=why)
            self._unchecked_told = True

    async def ntfy(self) -> str | None:
        n = self.settings.ntfy
        shown = readiness.work_address(n.url)
        now = self._monotonic()
        if self._refused is not None and not self.backoff.due(now):
            return self._refused
        url = f"{n.url.rstrip('/')}/{','.join(n.topics)}/json"
        headers = {"Authorization": f"Bearer {n.token}"} if n.token else {}
        since, wanted = self._since()
        try:
            async with asyncio.timeout(self.budget), self._client() as client:
                response = await client.get(
                    url, params={"poll": "1", "since": since}, headers=headers
                )
        except (httpx.HTTPError, TimeoutError, OSError) as exc:
            detail = type(exc).__name__
            if isinstance(exc, TimeoutError | httpx.TimeoutException):
                detail = f"no answer within {self.budget:g} s"
            return f"ntfy unreachable from this node ({shown}: {detail})"
        status = response.status_code
        said = diagnose.ntfy_error(response.text) if status >= 300 else None
        if probe_backoff.is_refusal(status, said):
            self.backoff = probe_backoff.refused(self.backoff, now)
            # One text for the whole wait: the reason (and its log line) changes per refusal.
            self._refused = (
                f"ntfy answered HTTP {status}" + (f" ({said})" if said else "") + ": its"
                f" credentials are refused; probing again in {self.backoff.wait(now):.0f} s"
                " (ntfy locks out an address after 30 failed logins)"
            )
            log.warning(
                "readiness.ntfy_refused",
                node=self.node,
                status=status,
                refusals=self.backoff.refusals,
                next_try_s=round(self.backoff.wait(now)),
            )
            return self._refused
        self._refused = None
        if 200 <= status < 300:
            self.backoff = probe_backoff.accepted()  # only an accepted login resets the wait
        if status == 429:
            # The request bucket (or subscriptions): route, server and credentials work.
            log.info("readiness.ntfy_rate_limited", node=self.node)
            return None
        if not 200 <= status < 300:
            return f"ntfy answered HTTP {status}" + (f" ({said})" if said else "")
        if wanted is not None and wanted not in message_ids(response.text):
            return (
                f"its ntfy ({shown}) does not hold the leader's last message {wanted}:"
                " another ntfy server?"
            )
        return None

    async def relay(self, url: str) -> str | None:
        target = relay_target(url)
        shown = readiness.work_address(url)
        try:
            async with asyncio.timeout(self.budget), self._client() as client:
                response = await client.head(target)
        except (httpx.HTTPError, TimeoutError, OSError) as exc:
            detail = type(exc).__name__
            if isinstance(exc, TimeoutError | httpx.TimeoutException):
                detail = f"no answer within {self.budget:g} s"
            return f"relay unreachable from this node ({shown}: {detail})"
        if response.status_code in PROXY_FAILURES:
            return f"relay unreachable from this node ({shown}: HTTP {response.status_code})"
        return None
