"""The console's page data and rendering: Jinja2 templates that escape everything and strip
control characters from every string they print.

A page is read and rendered in one trip to the thread pool (`Reader.page`), never on the event
loop the daemon's intake runs on: its queries run on the console's own read-only connection
inside one short read transaction, so the writer neither waits for a page nor loses the loop to
one. The cadence figures come from the owner queue's published view (`OwnerQueue.view`, a copy
made after each COMMIT that changed it), never from the live state the writer's thread folds.
"""

from __future__ import annotations

import json
import re
import threading
import time
import weakref
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


# Every character `sanitize.strip_control` (one line) or `valid_utf8` changes: C0, DEL, C1 (which
# holds the 8-bit escape introducers), the bidi controls and marks, U+2028/9, lone surrogates.
# A string holding none of them is printed as it is: one scan instead of four.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _text(value: object) -> str:
    """Any value as one safe line of text: valid UTF-8, no control characters (Jinja escapes)."""
    if value is None:
        return ""
    text = str(value)
    if _UNSAFE.search(text) is None:
        return text
    return sanitize.strip_control(str(sanitize.valid_utf8(text)))


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


def _ago(seconds: object) -> str:
    age = _age(seconds)
    return age if age == "never" else f"{age} ago"


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
_ENV.filters["ago"] = _ago
_ENV.filters["json"] = lambda value: json.dumps(value, ensure_ascii=True, sort_keys=True)


def render(template: str, status_code: int, context: Mapping[str, Any]) -> HTMLResponse:
    return HTMLResponse(_ENV.get_template(template).render(context), status_code)


class Reader:
    """One read-only connection to the daemon's database, opened on first use, used from the
    thread pool under its own lock (the writer never waits for it: WAL). The page builders
    (`overview`, `incidents`, ...) run in the thread pool, called by `page`."""

    def __init__(self, settings: Settings, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._conn: db.Connection | None = None
        self._lock = threading.Lock()

    def read(self, call: Callable[[db.Connection], T]) -> T:
        """`call(conn)` inside one read transaction (in the thread pool)."""
        with self._lock:
            if self._conn is None:
                self._conn = db.connect(self._settings.state.store, readonly=True)
                # The console lives as long as the HTTP app that holds it: its connection (a
                # PostgreSQL session) is closed when the app is let go, not left to the driver.
                weakref.finalize(self, self._conn.close)
            with console_reads.snapshot(self._conn) as conn:
                return call(conn)

    async def page(
        self, template: str, context: Mapping[str, Any], build: Callable[[], Mapping[str, Any]]
    ) -> HTMLResponse:
        """`build()` (a builder below) and the template around it, in one thread-pool trip."""

        def work() -> HTMLResponse:
            return render(template, 200, {**context, **build()})

        return await run_in_threadpool(work)

    def overview(self, policy: cadence.Policy, view: cadence.CadenceState) -> dict[str, Any]:
        """`view`: a published copy (nothing folds into it while this reads)."""
        now = self._clock()
        report = self.read(lambda conn: status.collect(conn, self._settings, now))
        return {
            "report": report,
            "cap": policy.daily_cap,
            "sent_today": view.triage_messages_today(policy, now),
            "cap_resets": _next_local_midnight(policy.timezone, now),
            "silences": [s.to_json(now) for s in view.silences.active(now)],
            "topics": list(self._settings.ntfy.topics),
            "now": now,
        }

    def incidents(self, before: str | None = None) -> dict[str, Any]:
        """A page of incidents; `before`: the cursor of the previous page's last (untrusted)."""
        cursor = console_reads.parse_cursor(before)
        found = self.read(lambda conn: console_reads.incidents(conn, before=cursor))
        full = len(found) >= console_reads.INCIDENTS_PAGE
        return {
            "incidents": found,
            "older": found[-1].cursor if full else None,
            "paged": cursor is not None,
        }

    def deliveries(self) -> dict[str, Any]:
        def both(conn: db.Connection) -> dict[str, Any]:
            return {
                "pending": console_reads.deliveries(conn, "pending"),
                "dead": console_reads.deliveries(conn, "dead"),
            }

        return self.read(both)

    def owner(self) -> dict[str, Any]:
        return {"messages": self.read(console_reads.owner_messages)}

    def quarantine(self) -> dict[str, Any]:
        return {"frames": self.read(console_reads.quarantine)}

    def audit(self, kind: str, needle: str) -> dict[str, Any]:
        records = console_reads.audit_tail(
            self._settings.state.audit_dir, kind=kind or None, needle=needle or None
        )
        return {"records": records, "kind": kind, "needle": needle}


def _next_local_midnight(timezone: str, now: float) -> str:
    from zoneinfo import ZoneInfo  # noqa: PLC0415 - cheap, and only the overview needs it

    zone = ZoneInfo(timezone)
    today = datetime.fromtimestamp(now, zone).date()
    midnight = datetime.combine(today, datetime.min.time(), zone).timestamp() + 86400
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(midnight)) + "Z"
