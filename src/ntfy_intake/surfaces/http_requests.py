"""What every endpoint of the HTTP surface shares: the JSON answer, the refusal (`Reject`, a
JSON error), the body read within its bound, the bearer check, and the guard every token check
(bearer and console login alike) goes through (`LoginGuard`: failed logins throttled)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import Response

from ntfy_intake.rules import login_throttle
from ntfy_intake.rules.notices import Notice, login_throttled
from ntfy_intake.wire import jsonsafe

log = structlog.get_logger("ntfy_intake.http")

NoticeSink = Callable[[Notice], Awaitable[object]]
"""Records a notice for the owner (the leader's `Journal.note`); None where nothing can write."""


class Reject(Exception):
    """Raised inside a handler to answer with a JSON error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def json_response(status: int, body: object, headers: Mapping[str, str] | None = None) -> Response:
    # ensure_ascii: untrusted alert text travels escaped, so no raw control or bidi character
    # reaches a client that prints the body.
    content = json.dumps(body, ensure_ascii=True, allow_nan=False)
    return Response(content, status, headers, media_type="application/json")


def error(status: int, code: str, message: str | None = None, **headers: str) -> Response:
    body = {"error": code} if message is None else {"error": code, "message": message}
    return json_response(status, body, {k.replace("_", "-"): v for k, v in headers.items()})


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise Reject(413, "body_too_large", f"at most {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Reject(413, "body_too_large", f"at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def json_object(request: Request, limit: int) -> dict[str, Any]:
    raw = await read_body(request, limit)
    try:
        # strict: a lone surrogate is refused (400) rather than stored as something the client
        # did not send; deep nesting, NaN and out-of-range numbers are 400s too, never 500s.
        body = jsonsafe.loads(raw, strict=True)
    except jsonsafe.BadJson as exc:
        raise Reject(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Reject(400, "bad_json", "the body must be a JSON object")
    return body


# -- auth -----------------------------------------------------------------------------------------


class LoginGuard:
    """Every token check of one HTTP surface, throttled (rules/login_throttle.py).

    Shared by the bearer endpoints and the console's login (one per app: `create_app` keeps it
    in `app.state.login_guard`), so guesses count the same wherever they are made. The first
    hold of an episode is logged and, where `notice` is given (the leader), recorded for the
    owner in a task of its own: a guesser never waits for the database, and a notice that
    cannot be recorded is logged, never raised into a request.
    """

    def __init__(
        self,
        notice: NoticeSink | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        policy: login_throttle.Policy | None = None,
    ) -> None:
        self.throttle = login_throttle.Throttle(policy)
        self._notice = notice
        self._clock = clock
        self._wall = wall
        self._tasks: set[asyncio.Task[None]] = set()
        self.checked = 0  # tokens compared (what a guesser gets), for tests and figures

    @staticmethod
    def address(request: Request) -> str:
        """The client counted: the peer, or, when the peer is this box (a reverse proxy on it),
        the address the proxy appended to `X-Forwarded-For`, so that agents connecting directly
        (no header) are not held with whoever guesses through the proxy. Why trust the header
        then: only a process on this box can send it from loopback, and what it gains by forging
        is bounded: a loopback address it names counts as loopback (one bucket), any other
        address is held by the overall count too (rules/login_throttle.py)."""
        peer = request.client.host if request.client is not None else "unknown"
        forwarded = request.headers.get("x-forwarded-for", "")
        if forwarded and login_throttle.is_loopback(peer):
            last = forwarded.rsplit(",", 1)[-1].strip()
            with contextlib.suppress(ValueError):
                return str(ipaddress.ip_address(last))
        return peer

    def held(self, request: Request) -> int | None:
        """Retry-After seconds when this client may not try a token now; None when it may."""
        wait = self.throttle.held(self.address(request), self._clock())
        return login_throttle.retry_after(wait) if wait > 0 else None

    def check(self, request: Request, presented: str, token: str) -> bool:
        """Compare in constant time and count the outcome; only call when `held` is None."""
        self.checked += 1
        ok = hmac.compare_digest(presented.encode("utf-8", "replace"), token.encode())
        if ok:
            self.throttle.succeeded(self.address(request), self._clock())
            return True
        self.failed(request)
        return False

    def failed(self, request: Request) -> None:
        """Count a wrong credential checked elsewhere (an action button's token:
        surfaces/owner_actions.py) as a wrong token here: guesses count the same everywhere."""
        outcome = self.throttle.failed(self.address(request), self._clock())
        for who, failures in outcome.began:
            hold = outcome.hold if who != login_throttle.OVERALL else self._overall_hold()
            log.warning("http.logins_held", address=who, failures=failures, hold_s=hold)
            if self._notice is not None:
                episode = f"{int(self._wall())}"
                self._record(login_throttled(who, failures, hold, episode))

    def _overall_hold(self) -> float:
        return self.throttle.policy.first_hold

    def _record(self, notice: Notice) -> None:
        assert self._notice is not None
        sink = self._notice

        async def record() -> None:
            try:
                await sink(notice)
            except Exception as exc:  # noqa: BLE001 - the log line above already says it
                log.error("http.logins_notice_failed", error_type=type(exc).__name__)

        task = asyncio.get_running_loop().create_task(record(), name="login-notice")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def held_answer(retry_after: int) -> Response:
    # Connection: close: the answer may come before a request body is read (the hold is
    # checked first), and a client must not send its next request on a connection the server
    # then closes.
    return error(
        429,
        "too_many_failed_logins",
        f"too many wrong tokens from this address; retry in {retry_after} s",
        Retry_After=str(retry_after),
        Connection="close",
    )


def authorize(request: Request, token: str, guard: LoginGuard) -> Response | None:
    """None when the bearer token matches; else the 401/403/429 answer (never echoing anything).

    A held client gets 429 before its token is looked at, right or wrong."""
    wait = guard.held(request)
    if wait is not None:
        return held_answer(wait)
    scheme, _, presented = request.headers.get("authorization", "").strip().partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        return error(
            401,
            "unauthorized",
            "send Authorization: Bearer <http.token>",
            WWW_Authenticate="Bearer",
        )
    if not guard.check(request, presented, token):
        return error(403, "forbidden", "the bearer token does not match")
    return None
