"""When the daemon's ticker next has something to do (issue 36: no fixed polling tick).

The ticker saves the cursor once the reorder window passed, the last frame's server time, closes
debounce windows and watches liveness. Each of those has a due time; the ticker sleeps until the
earliest of them, never longer than `ceiling` (the loop's heartbeat, which the dead-man's switch
and the systemd watchdog read to tell a wedged loop from an idle one) and never shorter than
`floor` (the old fixed tick: a due time that stays in the past, e.g. a cursor that cannot be saved
while the audit log is latched, costs what it always did, not a busy loop).
"""

from __future__ import annotations

from collections.abc import Iterable


def wait(now: float, due: Iterable[float | None], *, floor: float, ceiling: float) -> float:
    """Seconds to sleep from `now` until the earliest of `due` (None: nothing due), within
    [floor, ceiling]."""
    soonest = min((at for at in due if at is not None), default=None)
    if soonest is None:
        return ceiling
    return min(ceiling, max(floor, soonest - now))
