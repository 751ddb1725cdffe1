"""The owner console's routes (DESIGN.md section 10): login, the pages, the forms.

Invariants owned here:
- off unless `http.token` is set (the caller mounts no route at all then);
- no page and no action without a session: a GET without one is redirected to the login page
  (no alert data in the answer), a POST without one is 403; a wrong token at login is 403;
- the login's token check goes through the surface's `LoginGuard` (the bearer endpoints' too):
  a client held for failed logins gets 429 with Retry-After before its token is looked at;
- every POST carries the session's CSRF token (the login form a double-submit one), else 403;
  logging out is such a POST too (a GET only shows the button: a link elsewhere cannot log the
  owner out);
- every answer has `Content-Security-Policy: default-src 'self'` and `X-Frame-Options: DENY`,
  and is never cached; templates autoescape and strip control characters (`text` filter), so
  a string from ntfy is text, never markup;
- pages are read (their own read-only connection, one short read transaction) and rendered in
  the thread pool, never on the daemon's event loop; actions go through the daemon's writer
  (`Actions`). A standby's pages hold no action form: each action is a link to the same page
  on the leader's console (its `[cluster] url`), or, where that is unknown, says who leads.
  (Forms posted across origins would carry this node's CSRF token, which the leader's
  sessions never issued: it refused every one, 403.)
"""

from __future__ import annotations

import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ntfy_intake.rules import cadence, silences
from ntfy_intake.settings import Settings
from ntfy_intake.surfaces.console import views
from ntfy_intake.surfaces.console.actions import Actions
from ntfy_intake.surfaces.console.sessions import COOKIE, Session, Sessions
from ntfy_intake.surfaces.http_requests import LoginGuard

log = structlog.get_logger("ntfy_intake.console")

HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": "default-src 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
LOGIN_COOKIE = "ntfy_intake_login"
MAX_FORM = 16 * 1024
STATIC = Path(__file__).parent / "static"
_STATIC_FILES = {"console.css": "text/css", "console.js": "text/javascript"}


@dataclass
class Config:
    settings: Settings
    health: Callable[[], tuple[bool, Mapping[str, Any]]]
    # The policy and the owner queue's published view (OwnerQueue.view), never its live state.
    cadence: Callable[[], tuple[cadence.Policy, cadence.CadenceState]]
    actions: Actions | None = None
    leader: Callable[[], str | None] = lambda: None  # the leader's console URL on a standby
    clock: Callable[[], float] = time.time
    sessions: Sessions | None = field(default=None, repr=False)


def routes(config: Config) -> list[BaseRoute]:
    """The console's routes under /console; none at all without `http.token`."""
    token = config.settings.http.token
    if not token:
        return []
    sessions = config.sessions or Sessions(config.clock)
    reader = views.Reader(config.settings, config.clock)
    own_guard = LoginGuard()  # used only where no app-wide one exists (not made by create_app)

    def guard_of(request: Request) -> LoginGuard:
        shared = getattr(request.app.state, "login_guard", None)
        return shared if isinstance(shared, LoginGuard) else own_guard

    def secure(request: Request) -> bool:
        return (
            request.url.scheme == "https"
            or request.headers.get("x-forwarded-proto", "").lower() == "https"
        )

    def answer(response: Response) -> Response:
        response.headers.update(HEADERS)
        return response

    def status_line() -> str:
        try:
            ok, details = config.health()
            return str(details.get("status", "live" if ok else "unhealthy"))
        except Exception:  # noqa: BLE001 - a failing check is shown as unknown
            return "unknown"

    def page(request: Request, template: str, code: int = 200, **context: Any) -> Response:
        defaults = {"status": status_line(), "leader": None, "leader_base": "", "nav": "login"}
        return answer(views.render(template, code, {**defaults, **context}))

    def session_of(request: Request) -> Session | None:
        return sessions.get(request.cookies.get(COOKIE))

    async def form(request: Request) -> dict[str, str]:
        # Only urlencoded forms (what the templates send); parsed here, no multipart library.
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_FORM:
                return {}
        try:
            pairs = urllib.parse.parse_qsl(
                raw.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=20
            )
        except ValueError:
            return {}
        return dict(pairs)

    def base(request: Request, session: Session, name: str) -> dict[str, Any]:
        leader = config.leader()
        return {
            "csrf": session.csrf,
            "nav": name,
            "status": status_line(),
            # On a standby (`leader` set) actions are links to the leader's pages when its URL
            # is known (`leader_base`), else the page says who leads; never a form.
            "leader_base": _origin(leader) if _is_url(leader) else "",
            "leader": leader,
        }

    def viewer(
        name: str, template: str, build: Callable[[Request], Callable[[], dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            session = session_of(request)
            if session is None:
                return answer(RedirectResponse("/console/login", 303))
            # Read and rendered in the thread pool (views.Reader.page): not on this loop.
            return answer(await reader.page(template, base(request, session, name), build(request)))

        return handler

    def overview(request: Request) -> Callable[[], dict[str, Any]]:
        policy, view = config.cadence()  # the published view: a reference, taken here
        return lambda: reader.overview(policy, view)

    def audit_page(request: Request) -> Callable[[], dict[str, Any]]:
        kind = request.query_params.get("kind", "")[:40]
        needle = request.query_params.get("id", "")[:200]
        return lambda: reader.audit(kind, needle)

    def incidents(request: Request) -> Callable[[], dict[str, Any]]:
        before = request.query_params.get("before")
        return lambda: reader.incidents(before)

    def plain(build: Callable[[], dict[str, Any]]) -> Callable[[Request], Callable[[], Any]]:
        return lambda request: build

    async def login_form(request: Request) -> Response:
        nonce = secrets.token_urlsafe(24)
        response = page(request, "login.html", csrf=nonce)
        response.set_cookie(
            LOGIN_COOKIE,
            nonce,
            max_age=600,
            httponly=True,
            samesite="strict",
            secure=secure(request),
        )
        return response

    async def login(request: Request) -> Response:
        fields = await form(request)  # read first: an answer before the body resets it
        guard = guard_of(request)
        wait = guard.held(request)
        if wait is not None:
            why = f"too many wrong tokens from this address: try again in {wait} s"
            held = page(request, "refused.html", 429, why=why)
            held.headers["Retry-After"] = str(wait)
            return held
        nonce = request.cookies.get(LOGIN_COOKIE, "")
        if not nonce or not secrets.compare_digest(fields.get("csrf", ""), nonce):
            return page(
                request, "refused.html", 403, why="the form expired: open the login page again"
            )
        if not guard.check(request, fields.get("token", ""), token):
            log.warning("console.login_refused", address=LoginGuard.address(request))
            return page(request, "refused.html", 403, why="the token does not match")
        session = sessions.open()
        response = answer(RedirectResponse("/console/", 303))
        response.set_cookie(
            COOKIE,
            session.sid,
            max_age=int(sessions.ttl),
            path="/console",
            httponly=True,
            samesite="strict",
            secure=secure(request),
        )
        response.delete_cookie(LOGIN_COOKIE)
        return response

    async def logout_form(request: Request) -> Response:
        session = session_of(request)
        if session is None:
            return answer(RedirectResponse("/console/login", 303))
        return page(request, "logout.html", csrf=session.csrf)

    async def logout(request: Request) -> Response:
        session = session_of(request)
        if session is not None:
            if not Sessions.csrf_ok(session, (await form(request)).get("csrf")):
                return page(request, "refused.html", 403, why="the form's CSRF token is missing")
            sessions.close(session.sid)
        response = answer(RedirectResponse("/console/login", 303))
        response.delete_cookie(COOKIE, path="/console")
        return response

    def action(
        run: Callable[[dict[str, str]], Awaitable[str]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            session = session_of(request)
            if session is None:
                return page(request, "refused.html", 403, why="log in first")
            fields = await form(request)
            if not Sessions.csrf_ok(session, fields.get("csrf")):
                return page(request, "refused.html", 403, why="the form's CSRF token is missing")
            if config.actions is None:
                why = "this node takes no actions: it stands by (act on the leader's console)"
                return page(request, "refused.html", 409, why=why)
            try:
                where = await run(fields)
            except silences.SilenceError as exc:
                return page(request, "refused.html", 400, why=str(exc))
            return answer(RedirectResponse(where, 303))

        return handler

    async def redrive(fields: dict[str, str]) -> str:
        assert config.actions is not None
        key = fields.get("key", "")
        done = await config.actions.redrive(None if fields.get("all") else [key[:200]])
        log.info("console.redriven", count=len(done))
        return "/console/deliveries"

    async def silence_add(fields: dict[str, str]) -> str:
        assert config.actions is not None
        span = silences.parse_span(fields.get("for", ""))
        await config.actions.add_silence(
            fields.get("scope", ""), fields.get("target", ""), span, fields.get("reason", "")
        )
        back = fields.get("back", "")
        return back if back in ("/console/", "/console/incidents") else "/console/"

    async def silence_end(fields: dict[str, str]) -> str:
        assert config.actions is not None
        await config.actions.end_silence(fields.get("id", "")[:60])
        return "/console/"

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC_FILES:
            return answer(Response("not found", 404, media_type="text/plain"))
        return answer(FileResponse(STATIC / name, media_type=_STATIC_FILES[name]))

    get, post = ["GET"], ["POST"]
    return [
        Route("/console/login", login_form, methods=get),
        Route("/console/login", login, methods=post),
        Route("/console/logout", logout_form, methods=get),
        Route("/console/logout", logout, methods=post),
        Route("/console/", viewer("overview", "overview.html", overview), methods=get),
        Route("/console", lambda r: answer(RedirectResponse("/console/", 308)), methods=get),
        Route("/console/incidents", viewer("incidents", "incidents.html", incidents), methods=get),
        Route(
            "/console/deliveries",
            viewer("deliveries", "deliveries.html", plain(reader.deliveries)),
            methods=get,
        ),
        Route("/console/owner", viewer("owner", "owner.html", plain(reader.owner)), methods=get),
        Route(
            "/console/quarantine",
            viewer("quarantine", "quarantine.html", plain(reader.quarantine)),
            methods=get,
        ),
        Route("/console/audit", viewer("audit", "audit.html", audit_page), methods=get),
        Route("/console/redrive", action(redrive), methods=post),
        Route("/console/silences", action(silence_add), methods=post),
        Route("/console/silences/end", action(silence_end), methods=post),
        Route("/console/static/{name}", static, methods=get),
    ]


def _is_url(text: str | None) -> bool:
    return text is not None and text.startswith(("http://", "https://"))


def _origin(console_url: str | None) -> str:
    """The leader's console URL as the forms' prefix (they add /console/...)."""
    return (console_url or "").rstrip("/").removesuffix("/console")
