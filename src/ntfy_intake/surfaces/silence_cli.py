"""The core of ``ntfy-intake silence add|list|end`` (docs/console.md, "Silences").

Silences are made only through the running daemon's HTTP surface (``/v1/silences``, bearer
``http.token``): the daemon folds each one into its cadence the moment it is made, so a silence
written behind its back would not hold until the next restart. When the daemon does not run the
command refuses, honestly, instead of writing anything: one line, exit 2.

Where the daemon listens is read from its last health snapshot in the store (the port it bound,
which may be an ephemeral one); a snapshot older than `status.SNAPSHOT_STALE_AFTER`, a stopped
daemon, or a refused connection all mean "not running".

Exit codes: 0 done; 1 the daemon said no (no such silence holds); 2 bad input, no token, a token
the daemon refuses, or no daemon running. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ntfy_intake.rules import silences
from ntfy_intake.rules.sanitize import one_line
from ntfy_intake.settings import Settings
from ntfy_intake.store import db, summary
from ntfy_intake.surfaces.status import SNAPSHOT_STALE_AFTER

__all__ = ["EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "add", "end", "listed"]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
TIMEOUT = 10.0
NOT_RUNNING = "the daemon is not running; silences are made through it"


def _unreadable() -> tuple[type[Exception], ...]:
    return (*db.ERRORS, OSError, ValueError)  # db.ERRORS as it is now


class _Refused(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class _Daemon:
    base: str
    token: str


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"ntfy-intake silence: {one_line(message, 500)}\n")
    sys.stderr.flush()
    return code


def _locate(settings: Settings, now: float) -> _Daemon:
    token = settings.http.token
    if not token:
        raise _Refused("http.token is not set: the daemon serves /v1/silences only with a token")
    path = settings.state.store
    if not db.exists(path):
        raise _Refused(NOT_RUNNING)
    try:
        conn = db.connect(path, readonly=True)
        try:
            snapshot = summary.read(conn).snapshot
        finally:
            conn.close()
    except _unreadable() as exc:
        raise _Refused(f"cannot read the daemon's state at {path}: {exc}") from exc
    updated = snapshot.get("updated_at")
    port = snapshot.get("http_port")
    if (
        not isinstance(updated, int | float)
        or now - float(updated) > SNAPSHOT_STALE_AFTER
        or snapshot.get("state") == "stopped"
        or not isinstance(port, int)
    ):
        raise _Refused(NOT_RUNNING)
    host = settings.http.host
    if host in ("", "0.0.0.0", "::", "[::]"):  # noqa: S104 - listening everywhere: ask loopback
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return _Daemon(f"http://{host}:{port}", token)


def _call(settings: Settings, method: str, path: str, body: object = None) -> tuple[int, Any]:
    daemon = _locate(settings, time.time())
    headers = {"Authorization": f"Bearer {daemon.token}"}
    try:
        answer = httpx.request(
            method, daemon.base + path, headers=headers, json=body, timeout=TIMEOUT
        )
    except httpx.TransportError as exc:
        if isinstance(exc, httpx.ConnectError):
            raise _Refused(NOT_RUNNING) from exc
        raise _Refused(f"the daemon did not answer: {type(exc).__name__}") from exc
    if answer.status_code in (401, 403):
        raise _Refused("http.token does not match the running daemon's (check --config)")
    if answer.status_code == 404 and method == "GET":
        raise _Refused("the running daemon serves no /v1/silences (is it an older version?)")
    if answer.status_code >= 500:
        raise _Refused(f"the daemon failed the request (HTTP {answer.status_code})", EXIT_REFUSED)
    try:
        return answer.status_code, answer.json()
    except ValueError as exc:
        raise _Refused(f"the daemon's answer is not JSON (HTTP {answer.status_code})") from exc


def _line(item: dict[str, Any]) -> str:
    reason = f"  ({item['reason']})" if item.get("reason") else ""
    return (
        f"{item.get('id')}  {item.get('scope')} {item.get('target')!r}  until {item.get('until')}"
        f"  ({item.get('remaining_s')} s left){reason}"
    )


def add(settings: Settings, scope: str, target: str, span: str, reason: str) -> int:
    """Silence a topic or an incident for `span` (30m, 2h, 1d: 1 min to 24 h)."""
    try:
        silences.parse_span(span)
        silences.check(scope, target, reason)
    except silences.SilenceError as exc:
        return _fail(f"--{exc}" if str(exc).startswith("for:") else str(exc), EXIT_USAGE)
    try:
        status, body = _call(
            settings,
            "POST",
            "/v1/silences",
            {"scope": scope, "target": target, "for": span, "reason": reason},
        )
    except _Refused as exc:
        return _fail(str(exc), exc.code)
    if status != 201 or not isinstance(body, dict):
        message = body.get("message") if isinstance(body, dict) else None
        return _fail(f"the daemon refused: {message or f'HTTP {status}'}", EXIT_USAGE)
    print(f"silenced: {_line(body)}")
    return EXIT_OK


def listed(settings: Settings, *, as_json: bool = False) -> int:
    """Print the silences that hold now (one per line, or one JSON array)."""
    try:
        _, body = _call(settings, "GET", "/v1/silences")
    except _Refused as exc:
        return _fail(str(exc), exc.code)
    items = [item for item in body if isinstance(item, dict)] if isinstance(body, list) else []
    if as_json:
        print(json.dumps(items, ensure_ascii=True))
    elif not items:
        print("no silences hold")
    else:
        for item in items:
            print(_line(item))
    return EXIT_OK


def end(settings: Settings, silence_id: str) -> int:
    """End a silence before its time."""
    if not silences.valid_id(silence_id):
        return _fail(f"not a silence id (sil_...): {silence_id!r}", EXIT_USAGE)
    try:
        status, _ = _call(settings, "POST", f"/v1/silences/{silence_id}/end")
    except _Refused as exc:
        return _fail(str(exc), exc.code)
    if status != 200:
        return _fail(f"no such silence holds: {silence_id}", EXIT_REFUSED)
    print(f"ended {silence_id}")
    return EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`silence add|list|end`'s arguments; returns the actions' parsers."""
    actions = parser.add_subparsers(dest="silence_command", required=True, metavar="ACTION")
    action = actions.add_parser("add", help="hold back triage owner messages for a while")
    what = action.add_mutually_exclusive_group(required=True)
    what.add_argument("--topic", help="an ntfy topic")
    what.add_argument("--incident", help="an incident key")
    action.add_argument("--for", dest="span", required=True, help="30m, 2h, 1d (1 min to 24 h)")
    action.add_argument("--reason", default="", help="why, shown on the console")
    action = actions.add_parser("list", help="the silences that hold now")
    action.add_argument("--json", action="store_true", help="one JSON array, for machines")
    action = actions.add_parser("end", help="end a silence before its time")
    action.add_argument("silence_id", metavar="ID", help="the silence's id (sil_...)")
    return list(actions.choices.values())


def run(settings: Settings, args: argparse.Namespace) -> int:
    """`silence add|list|end`, as the command line parsed it."""
    if args.silence_command == "add":
        scope, target = (
            ("topic", args.topic) if args.topic is not None else ("incident", args.incident)
        )
        return add(settings, scope, target, args.span, args.reason)
    if args.silence_command == "list":
        return listed(settings, as_json=args.json)
    return end(settings, args.silence_id)
