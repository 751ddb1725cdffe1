"""Leadership by lease (DESIGN.md section 9), the arithmetic and the decisions: no I/O, no clock.

Two clocks meet here and never mix. The lease row's times (`Seen`) are the PostgreSQL server's
(`now()`), compared only with each other; the leader's own deadline (`LocalLease`) is on the
caller's monotonic clock (`time.monotonic()`), passed in as `now` / `started`. A duration
(`Seen.remaining`) may cross from one to the other, an instant never does.

Invariants owned here:
- a leader's local deadline is the START of its last successful renewal + `lease_ttl - margin`,
  never more: the server set `expires_at = now() + ttl` after that start, so the local deadline
  falls `margin` seconds before any standby can see the lease expired, whatever the network did;
- a renewal observed after the deadline, or one that failed, never extends it, and a lapsed
  `LocalLease` stays lapsed: a node that lost its deadline stops its side effects and must win
  a new term (`Action.TAKE`), it never slides back into the old one;
- `decide` takes a lease only when it is absent, expired, or this instance's own; a fresh lease
  of another instance under this node's name is first waited out (a crashed predecessor's) and
  is a collision only once it was seen renewed (another live process with the same name).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


def check_timing(ttl: float, renew_every: float) -> str | None:
    """The `[cluster]` timing rule, as problem text (None when it holds)."""
    if not ttl > 0 or not renew_every > 0:
        return f"lease_ttl ({ttl:g}s) and renew_every ({renew_every:g}s) must be positive"
    if ttl < 3 * renew_every:
        # Below 3x the local window (ttl - margin) is under 2 renewal periods: a renewal that
        # is slow by a fraction of a period would already cost the lease.
        return (
            f"lease_ttl ({ttl:g}s) must be at least 3 x renew_every ({renew_every:g}s):"
            f" set lease_ttl >= {3 * renew_every:g}s or renew_every <= {ttl / 3:g}s"
        )
    return None


def margin(ttl: float, renew_every: float) -> float:
    """How long before the server's expiry the leader stops on its own: max(renew_every, ttl/4).

    - >= renew_every: a loop that looks at the deadline only once per renewal tick still notices
      by `start + ttl` (its last look was at most one period before the deadline), and that is
      never after the server's `expires_at`, so no standby can have started yet;
    - >= ttl/4: for long TTLs, room for what a period does not bound: stopping the side effects
      (cancelling the stream, the relay, the owner sends), scheduling delays, and the two clocks
      running at slightly different rates (NTP slews by at most 0.05%; a quarter is far above).
    With `check_timing`'s ttl >= 3 x renew_every, ttl - margin >= 2 x renew_every (at the
    default 8s / 2s: a 6s window, so one failed renewal costs nothing).
    """
    return max(renew_every, ttl / 4)


class LocalLease:
    """The leader's own view of its lease, on the monotonic clock (module doc).

    `acquired` starts a holding from a claim that won a term, `renewed` extends it from a renewal
    that succeeded, `is_valid(now)` is what every side effect asks before it acts. Once it
    answered False (or a renewal came back too late) the holding is over for good.
    """

    __slots__ = ("_until", "margin", "ttl")

    def __init__(self, ttl: float, renew_every: float) -> None:
        self.ttl = ttl
        self.margin = margin(ttl, renew_every)
        self._until: float | None = None

    @property
    def window(self) -> float:
        return self.ttl - self.margin

    @property
    def deadline(self) -> float | None:
        """When the holding ends (monotonic), or None when it has none."""
        return self._until

    def acquired(self, started: float, now: float) -> bool:
        """A claim that STARTED at `started` won a term, seen at `now`: a holding until
        `started + window`, unless that has already passed (a claim slower than the window)."""
        until = started + self.window
        self._until = until if now < until else None
        return self._until is not None

    def renewed(self, started: float, now: float) -> bool:
        """A renewal that STARTED at `started` succeeded, seen at `now`. It extends the holding
        only while the holding is still valid at `now`; a late one ends it (the side effects may
        already have been stopped, and a standby may be about to take over)."""
        if not self.is_valid(now) or self._until is None:
            return False
        self._until = max(self._until, started + self.window)
        return True

    def is_valid(self, now: float) -> bool:
        """Whether side effects may run at `now`. False is sticky (module doc)."""
        if self._until is not None and now >= self._until:
            self._until = None
        return self._until is not None

    def lapse(self) -> None:
        """Give the holding up now (a failed renewal that showed the lease is gone, a fence
        that saw another term, a graceful stop)."""
        self._until = None


@dataclass(frozen=True, slots=True)
class Seen:
    """One read of the leadership row. `expires_at` is the server's clock (epoch seconds, to
    compare with other reads only); `remaining` is `expires_at - now()` on the server, a
    duration (negative once expired)."""

    node: str
    instance: str
    term: int
    expires_at: float
    remaining: float
    url: str = ""  # the holder's advertised HTTP surface ("" when it gives none)

    @property
    def expired(self) -> bool:
        return self.remaining <= 0


class Action(enum.Enum):
    RENEW = "renew"  # mine, fresh, the term I hold: renew it, same term
    TAKE = "take"  # absent, expired, or mine but not the term I hold: claim a new term
    STAND_BY = "stand_by"  # another node's fresh lease: watch it
    WAIT_OWN = "wait_own"  # my name, another instance, not seen renewing: a crashed one's lease
    COLLISION = "collision"  # my name, another instance that renews: exit 2 with one line


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    # The term the row holds (0 when there is none); a TAKE produces term + 1.
    term: int
    # How long to sleep before looking again (a standby also wakes on the release NOTIFY).
    wait: float
    # The one line for COLLISION; who holds it otherwise.
    message: str = ""


def decide(
    seen: Seen | None,
    *,
    node: str,
    instance: str,
    holding: int | None,
    renew_every: float,
    first_own: Seen | None = None,
    predecessor: str | None = None,
) -> Decision:
    """What a node does with a read of the row. `holding` is the term this instance holds
    (None when its LocalLease is not valid); `first_own` is the first read that showed another
    instance under this node's name, kept by the caller while it waits (None otherwise).

    `predecessor` is the prefix of instances known dead: those of this node's state directory
    in this boot, whose lock the caller holds (a process of it that still ran would hold the
    lock; runtime/cluster.directory_prefix: a copy of the directory is not it). A fresh
    lease of one is a crashed predecessor's for certain: taken at once, not waited out."""
    if seen is None:
        return Decision(Action.TAKE, 0, 0.0, "no leader yet")
    held_by = f"node {seen.node!r} holds term {seen.term}"
    if seen.instance == instance:
        if holding == seen.term and not seen.expired:
            return Decision(Action.RENEW, seen.term, renew_every, held_by)
        # Mine, but not a holding I still have (expired, or my deadline passed): a new term, so
        # whatever the lapsed holding left in flight is fenced off.
        return Decision(Action.TAKE, seen.term, 0.0, held_by)
    if seen.expired:
        return Decision(Action.TAKE, seen.term, 0.0, f"{held_by}, expired")
    # Wake right at its expiry when that comes before the next poll.
    wait = min(renew_every, seen.remaining)
    if seen.node != node:
        return Decision(Action.STAND_BY, seen.term, wait, held_by)
    if predecessor and seen.instance.startswith(predecessor):
        return Decision(Action.TAKE, seen.term, 0.0, f"{held_by} (this node's, before a crash)")
    renewing = first_own is not None and (
        first_own.instance == seen.instance and seen.expires_at > first_own.expires_at
    )
    if renewing:
        return Decision(
            Action.COLLISION,
            seen.term,
            0.0,
            f"node name {node!r} is in use: another process (instance {seen.instance}) keeps"
            f" renewing its lease; give this one its own [cluster] node",
        )
    return Decision(Action.WAIT_OWN, seen.term, wait, f"{held_by} (another instance)")
