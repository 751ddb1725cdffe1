"""The fallback topic's action buttons over HTTP: `POST /v1/owner/buttons/<action>` with the
button's token as the body (DESIGN.md section 13; flow/owner_buttons.py does the work).

- No session and no bearer token: the phone's ntfy app has neither. The signed token is the
  credential, and it travels in the body, not the URL, so it ends up in no proxy's access log;
  a text body with no custom header is also what a browser sends without a CORS preflight (the
  ntfy web app's buttons).
- Every refused token (forged, malformed, for the other button, expired) counts as a failed
  login in the surface's one `LoginGuard` (`app.state.login_guard`): 5 a minute from an address
  hold it (429 with Retry-After, unchecked), so tokens cannot be guessed. A used token (409)
  counts too: anyone who reads the fallback topic holds spent tokens, and each press of one
  would otherwise be an unthrottled write and audit line.
- One press at a time (the throttle's check and its count around it); one that waits more
  than `BUSY_WAIT` for the press before it (the store waiting out an outage) answers 503.
- The Host check is the app's (http_api: 421 for a name the daemon is not).
- Without `http.public_url` there are no buttons and no route (404). On a standby the route
  answers 503 naming the leader: a standby writes nothing, and ntfy's app does not follow a
  redirect for a POST (okhttp only follows GET and HEAD on 307).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ntfy_intake.errors import Fenced, StoreError
from ntfy_intake.flow.owner_buttons import OwnerButtons
from ntfy_intake.rules import action_tokens
from ntfy_intake.surfaces.http_requests import (
    LoginGuard,
    Reject,
    error,
    held_answer,
    json_response,
    read_body,
)
from ntfy_intake.wire.owner_channels import BUTTONS_PATH

log = structlog.get_logger("ntfy_intake.owner_actions")

MAX_BODY = 2 * action_tokens.MAX_TOKEN
BUSY_WAIT = 5.0  # seconds a press waits for the one before it
# The answer is readable from any origin: it tells only what the token's holder did, and a
# button in the ntfy web app reads it with fetch().
_HEADERS = {"Access-Control-Allow-Origin": "*", "Cache-Control": "no-store"}


def routes(
    buttons: OwnerButtons | None, *, leader: Callable[[], str] | None = None
) -> list[BaseRoute]:
    """The buttons' route: acting with `buttons`, refusing as a standby with `leader` (who
    leads), absent with neither (no `http.public_url`)."""
    if buttons is None and leader is None:
        return []
    own_guard = LoginGuard()  # used only where no app-wide one exists (not made by create_app)
    # One press at a time, its throttle check and its count together: checked before and
    # counted after a press, a burst sent at once all passed the check (11 to 27 of 30 forged
    # presses were each a write and an audit line, not 5). A press that waits longer than
    # BUSY_WAIT (the store waiting out an outage) is a 503, not one more parked request.
    one_at_a_time = asyncio.Lock()

    async def press(request: Request) -> Response:
        # Every answer, a refusal too (404, 429, 503): the web app's fetch() reads none that
        # lacks the header, and a held or refused press would look like a network error.
        answer = await act(request)
        for name, value in _HEADERS.items():
            answer.headers.setdefault(name, value)
        return answer

    async def act(request: Request) -> Response:
        action = action_tokens.action_named(str(request.path_params["action"]))
        if action is None:
            return error(404, "not_found")
        if buttons is None:
            assert leader is not None
            message = f"this node stands by and acts on nothing; the leader is {leader()}"
            return error(503, "standby", message, Retry_After="5")
        shared = getattr(request.app.state, "login_guard", None)
        guard = shared if isinstance(shared, LoginGuard) else own_guard
        wait = guard.held(request)
        if wait is not None:
            return held_answer(wait)
        try:
            token = (await read_body(request, MAX_BODY)).decode("ascii", "replace")
        except Reject:
            token = ""  # too long to be ours: refused as malformed, and counted
        try:
            async with asyncio.timeout(BUSY_WAIT):
                await one_at_a_time.acquire()
        except TimeoutError:
            message = "another press is being handled; retry"
            return error(503, "busy", message, Retry_After="5")
        try:
            # Checked again inside: the presses that waited were not counted when they passed
            # the first check, and the one before may have put the address on hold.
            wait = guard.held(request)
            if wait is not None:
                return held_answer(wait)
            pressed = await buttons.press(action, token, guard.address(request))
            if pressed.failed_login:
                guard.failed(request)
        except Fenced:
            # A failover between the lease check and the write: rolled back, nothing spent.
            message = "this node no longer leads; press again in a few seconds"
            return error(503, "standby", message, Retry_After="5")
        except StoreError:
            log.warning("http.store_unavailable", endpoint="owner_button")
            return error(503, "store_unavailable", "the database is busy; retry", Retry_After="1")
        finally:
            one_at_a_time.release()
        return json_response(pressed.status, pressed.body, _HEADERS)

    return [Route(BUTTONS_PATH + "{action}", press, methods=["POST"])]
