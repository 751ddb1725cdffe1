"""When the daemon's ticker next has something to do (issue 36: no fixed polling tick).

The ticker saves the cursor once the reorder window passed, the last frame's server time, closes
debounce windows, watches liveness and stores the health snapshot. Each of those has a due time;
the ticker sleeps until the earliest of them, never longer than `ceiling` (what bounds work no
due time names: a clock jump's notice, a storage episode's) and never shorter than `floor` (the
old fixed tick: a due time that stays in the past, e.g. a cursor that cannot be saved while the
audit log is latched, costs what it always did, not a busy loop). The ticker's heartbeat is its
promise to be back by then (flow/pipeline.Heartbeat), not a beat a second.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def wait(
    now: float,
    due: Iterable[float | None],
    *,
    floor: float,
    ceiling: float,
    gather: float = 0.0,
    lazy: Iterable[float | None] = (),
    lag: float = 0.0,
) -> float:
    """Seconds to sleep from `now` until the earliest of `due` (None: nothing due), within
    [floor, ceiling]; until the last of those due within `gather` after the earliest, so that
    one pass serves them all. A `lazy` time (work that may lag) falls due on its own only when
    no `due` one comes within `lag` after it: the pass that comes anyway serves it. (A cursor
    save, a frame time save and a snapshot store, each at most once a second or two, fell due
    at phases of their own: two or three passes a second while events flowed.)"""
    firm = _times(now, due)
    soonest = min(firm, default=None)
    times = sorted(
        firm + [at for at in _times(now, lazy) if soonest is None or not at <= soonest <= at + lag]
    )
    if not times:
        return ceiling
    wake = max(at for at in times if at - times[0] <= gather)
    return min(ceiling, max(floor, wake - now))


def sooner(
    now: float,
    due: Iterable[float | None],
    deadline: float,
    *,
    floor: float,
    lazy: Iterable[float | None] = (),
    lag: float = 0.0,
) -> bool:
    """Whether the earliest of `due` (None: nothing) comes before `deadline`, the ticker's
    wake-up already set: a committed batch wakes the ticker only then (a pass a second while
    events flow, not a wake-up per batch). The ticker keeps no finer time than `floor`: a time
    within it of `now` counts as `now + floor` (`wait` sleeps that long), one within it of
    `deadline` as the deadline itself (the due time the deadline was set for, read again). A
    `lazy` time counts only when the deadline is not within `lag` after it (as in `wait`)."""
    waits = [at for at in _times(now, lazy) if not at <= deadline <= at + lag]
    soonest = min((*_times(now, due), *waits), default=None)
    return soonest is not None and max(soonest, now + floor) < deadline - floor


def _times(now: float, times: Iterable[float | None]) -> list[float]:
    """The due times that name one: a time that never came (-inf: e.g. "never saved" plus the
    save interval) is due now; one that never comes (+inf, nan) is none. The gather's
    `at - times[0]` is nan against -inf: every time fell out of it and `max()` of nothing raised,
    the ticker's task died with it (a journal latched before the first cursor save)."""
    return [now if at == -math.inf else at for at in times if at is not None and at < math.inf]


def liveness_due(
    *,
    started_at: float,
    last_frame_at: float | None,
    live_since: float | None,
    dead_episode_open: bool,
    dead_after: float,
    recover_after: float,
) -> float | None:
    """When watchdog.LivenessTracker next owes a transition if no frame comes: `became_dead`
    once the silence passes `dead_after`; in a dead episode, `recovered` once live for
    `recover_after` (None: no live streak yet, a frame must come first)."""
    if not dead_episode_open:
        return (started_at if last_frame_at is None else last_frame_at) + dead_after
    return None if live_since is None else live_since + recover_after


def frame_due(
    last_frame_at: float | None, now: float, interval: float, slack: float
) -> float | None:
    """When the next keepalive frame should have arrived (`slack` after each `interval` counted
    from the last frame seen), after `now`: the ticker wakes then to take its time and store it
    in the snapshot `status` reads, which no wake-up of its own brings (a keepalive is no event).
    Periodic while ntfy is silent, never a time already past (no busy loop)."""
    if last_frame_at is None or interval <= 0:
        return None
    periods = max(1, math.ceil((now - last_frame_at - slack) / interval))
    due = last_frame_at + periods * interval + slack
    return due if due > now else due + interval
