"""The console's page data and rendering: reads in the thread pool, Jinja2 templates that
escape everything and strip control characters from every string they print."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse

from ntfy_intake.rules import cadence, sanitize
from ntfy_intake.settings import Settings
from ntfy_intake.store import console_reads, db
from ntfy_intake.surfaces import status

T = TypeVar("T")
TEMPLATES = Path(__file__).parent / "templates"


def _text(value: object) -> str:
    """Any value as one safe line of text: valid UTF-8, no control characters (Jinja escapes)."""
    if value is None:
        return ""
    return sanitize.strip_control(str(sanitize.valid_utf8(str(value))))


def _when(ts: object) -> str:
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return ""
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _age(seconds: object) -> str:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "never"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    finalize=lambda value: _text(value) if isinstance(value, str) else value,
    undefined=jinja2.StrictUndefined,
    auto_reload=False,
)
_ENV.filters["text"] = _text
_ENV.filters["when"] = _when
_ENV.filters["age"] = _age
_ENV.filters["json"] = lambda value: json.dumps(value, ensure_ascii=True, sort_keys=True)


def render(template: str, status_code: int, context: Mapping[str, Any]) -> HTMLResponse:
    return HTMLResponse(_ENV.get_template(template).render(context), status_code)


class Reader:
    """One read-only connection to the daemon's database, opened on first use, used from the
    thread pool under its own lock (the writer never waits for it: WAL)."""

    def __init__(self, settings: Settings, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._conn: db.Connection | None = None
        self._lock = threading.Lock()

    def _run(self, call: Callable[[db.Connection], T]) -> T:
        with self._lock:
            if self._conn is None:
                self._conn = db.connect(self._settings.state.store, readonly=True)
            return call(self._conn)

    async def read(self, call: Callable[[db.Connection], T]) -> T:
        return await run_in_threadpool(self._run, call)

    async def overview(self, policy: cadence.Policy, state: cadence.CadenceState) -> dict[str, Any]:
        now = self._clock()
        report = await self.read(lambda conn: status.collect(conn, self._settings, now))
        # The writer thread folds records into this state after each COMMIT: a read that
        # meets a dict changing size is simply read again.
        for _ in range(5):
            try:
                sent_today = state.triage_messages_today(policy, now)
                held = [s.to_json(now) for s in state.silences.active(now)]
                break
            except RuntimeError:
                continue
        else:
            sent_today, held = -1, []
        return {
            "report": report,
            "cap": policy.daily_cap,
            "sent_today": sent_today,
            "cap_resets": _next_local_midnight(policy.timezone, now),
            "silences": held,
            "topics": list(self._settings.ntfy.topics),
            "now": now,
        }

    async def incidents(self) -> dict[str, Any]:
        return {"incidents": await self.read(console_reads.incidents)}

    async def deliveries(self) -> dict[str, Any]:
        def both(conn: db.Connection) -> dict[str, Any]:
            return {
                "pending": console_reads.deliveries(conn, "pending"),
                "dead": console_reads.deliveries(conn, "dead"),
            }

        return await self.read(both)

    async def owner(self) -> dict[str, Any]:
        return {"messages": await self.read(console_reads.owner_messages)}

    async def quarantine(self) -> dict[str, Any]:
        return {"frames": await self.read(console_reads.quarantine)}

    async def audit(self, kind: str, needle: str) -> dict[str, Any]:
        directory = self._settings.state.audit_dir
        records = await run_in_threadpool(
            lambda: console_reads.audit_tail(directory, kind=kind or None, needle=needle or None)
        )
        return {"records": records, "kind": kind, "needle": needle}


def _next_local_midnight(timezone: str, now: float) -> str:
    from zoneinfo import ZoneInfo  # noqa: PLC0415 - cheap, and only the overview needs it

    zone = ZoneInfo(timezone)
    today = datetime.fromtimestamp(now, zone).date()
    midnight = datetime.combine(today, datetime.min.time(), zone).timestamp() + 86400
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(midnight)) + "Z"
