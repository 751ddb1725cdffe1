"""Silences over the loopback HTTP surface, for `ntfy-intake silence` while the daemon runs.

`GET /v1/silences`, `POST /v1/silences` `{"scope", "target", "for", "reason"}` (201 with the
silence), `POST /v1/silences/<id>/end` (200, or 404 when no such silence holds). Bearer token as
for the feed: missing 401, wrong 403, a client held for failed logins 429 (the surface's one
`LoginGuard`: guesses here count with the feed's and the console's); none at all without
`http.token`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ntfy_intake.rules import silences
from ntfy_intake.surfaces.console.actions import Actions
from ntfy_intake.surfaces.http_requests import LoginGuard, authorize
from ntfy_intake.wire import jsonsafe

MAX_BODY = 4096


def _json(status: int, body: object) -> Response:
    return Response(json.dumps(body, ensure_ascii=True), status, media_type="application/json")


def api_routes(token: str | None, actions: Actions, clock: Callable[[], float]) -> list[BaseRoute]:
    if not token:
        return []
    own_guard = LoginGuard()  # used only where no app-wide one exists (not made by create_app)

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            shared = getattr(request.app.state, "login_guard", None)
            guard = shared if isinstance(shared, LoginGuard) else own_guard
            denied = authorize(request, token, guard)
            if denied is not None:
                return denied
            return await handler(request)

        return wrapped

    async def listed(request: Request) -> Response:
        now = clock()
        return _json(200, [s.to_json(now) for s in actions.active()])

    async def add(request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            return _json(413, {"error": "body_too_large"})
        try:
            body: Any = jsonsafe.loads(raw, strict=True)
        except jsonsafe.BadJson:
            return _json(400, {"error": "bad_json"})
        if not isinstance(body, dict) or not all(
            isinstance(body.get(k, ""), str) for k in ("scope", "target", "for", "reason")
        ):
            return _json(400, {"error": "bad_request", "message": "string fields expected"})
        try:
            span = silences.parse_span(body.get("for", ""))
            made = await actions.add_silence(
                body.get("scope", ""), body.get("target", ""), span, body.get("reason", "")
            )
        except silences.SilenceError as exc:
            return _json(400, {"error": "bad_silence", "message": str(exc)})
        return _json(201, made.to_json(clock()))

    async def end(request: Request) -> Response:
        ended = await actions.end_silence(str(request.path_params["silence_id"]))
        return _json(200 if ended else 404, {"ended": ended})

    return [
        Route("/v1/silences", guarded(listed), methods=["GET"]),
        Route("/v1/silences", guarded(add), methods=["POST"]),
        Route("/v1/silences/{silence_id}/end", guarded(end), methods=["POST"]),
    ]
