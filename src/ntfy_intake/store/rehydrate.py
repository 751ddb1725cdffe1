"""Rebuild the cadence state at startup from the audit log, and from nothing else.

Only the files that can hold a record the state still needs are opened: records within
`Policy.retention` of `now` (the longest window: debounce, cooldown, notice window, a local
calendar day), plus one day of slack. A file is named by the UTC day it was written and a
line is written after its `ts`, so older files hold only older lines; the slack covers a clock
that stepped back between recording and writing. Start-up time therefore follows the traffic
of the last couple of days, not the length of the history.

Call it after `audit.recover()`, so outcomes that reached SQLite but not the log are folded too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ntfy_intake.rules.cadence import CadenceState, Policy
from ntfy_intake.store import audit

SLACK = 86400.0


@dataclass(frozen=True, slots=True)
class Rehydrated:
    state: CadenceState
    since_day: str  # the oldest audit file day that was read (YYYY-MM-DD, UTC)
    files: tuple[str, ...]  # names of the audit files read, oldest first
    records: int  # records read (every kind; the fold ignores what it does not need)


def since_day(policy: Policy, now: float) -> str:
    """The UTC day of the oldest audit file that can hold a record the state needs."""
    oldest = now - policy.retention - SLACK
    return datetime.fromtimestamp(oldest, UTC).strftime("%Y-%m-%d")


def load(audit_dir: Path, policy: Policy, now: float) -> Rehydrated:
    day = since_day(policy, now)
    files = tuple(
        path.name
        for path in audit.log_files(audit_dir)
        if path.name[len(audit.FILE_PREFIX) : -len(audit.FILE_SUFFIX)] >= day
    )
    state = CadenceState.empty(policy)
    records = 0
    for record in audit.read_records(audit_dir, since_day=day):
        state.apply(record)
        records += 1
    state.prune(now)
    return Rehydrated(state, day, files, records)
