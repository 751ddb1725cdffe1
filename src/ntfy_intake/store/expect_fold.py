"""The expectations' state (rules/expectations.py) from the audit log, at start-up and for
`status`: the only I/O the fold has.

Like the cadence (rehydrate.py), only the files that can hold a record the state needs are
opened: twice the longest `every + grace` back from `now`, plus a day of slack (files are named
by the UTC day they were written, so older files hold only older lines). An episode whose
`missed` notice is older than that (a publisher silent for days past its window) is not seen;
after a restart it is told once more, as a new episode anchored at the start: a reminder under
a key of its own, the price of not reading the whole history on every start. Then the journal's rows
the files do not hold yet (replay.unflushed_records): together, every recorded outcome. Folding
a record twice changes nothing, so overlap between the two is harmless.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from ntfy_intake.rules import expectations
from ntfy_intake.rules.expectations import Expectation, State
from ntfy_intake.store import audit_files, replay
from ntfy_intake.store.db import Connection

SLACK = 86400.0


def since_day(expected: tuple[Expectation, ...], now: float) -> str:
    """The UTC day of the oldest audit file that can hold a record the state needs."""
    longest = max((e.deadline for e in expected), default=0.0)
    oldest = max(0.0, now - 2 * longest - SLACK)
    return datetime.fromtimestamp(oldest, UTC).strftime("%Y-%m-%d")


def load(
    audit_dir: Path,
    expected: tuple[Expectation, ...],
    *,
    now: float,
    started: float,
    conn: Connection | None = None,
    folded_above: int | None = None,
) -> tuple[State, int]:
    """The state and how many records were read. `conn` and `folded_above` (the highest seq the
    files hold): also fold the journal's rows above it."""
    state = State.empty(expected, started)
    if not expected:
        return state, 0
    read = 0
    for record in audit_files.read_records(audit_dir, since_day=since_day(expected, now)):
        expectations.fold(state, record)
        read += 1
    if conn is not None and folded_above is not None:
        for record in replay.unflushed_records(conn, folded_above):
            expectations.fold(state, record)
            read += 1
    return state, read
