"""When a leader gives the work to another node (DESIGN.md section 11): plain values, a clock.

A second box exists for the day the first cannot do the work. Renewing the lease proves only
that a leader reaches the database; these rules look at the work itself:

- `work_state`: what the leader stores as its work at each probe, from the one health model's
  notions (rules/health.py): `latched` while the audit latch is set; `dead` while intake is not
  live AND a (re)connect has failed since the last frame (the health model's `error_current`),
  since the last frame (or since the term's daemon started, before its first one); `live`
  otherwise (frames fresh, or the first reconnect after a clean drop still under way);
- `decide`: yield, and to whom, or keep leading, and why. A leader yields only when
  * its work has been dead for `yield_after` (silence AND failing reconnects), or it is latched
    (with no wait of its own: the audit log it owes cannot be written, and a latch lasts until
    the daemon restarts, which a new term on another node is), AND
  * another node is ready (`ready_peers`, rules/readiness.py: seen ready within the last two
    probes, same fingerprint, known schema), AND
  * `yield_after` has passed in its own term: a node that just took over does not hand the
    work straight back; this bounds any back-and-forth to one move per `yield_after`;
  with no ready peer it keeps leading (nothing better exists), and health says so;
- `cooloff`: after a yield, this node does not campaign for `cluster.yield_cooloff` while
  another node is ready, so the node it yielded to takes the lease, not itself again. The
  cool-off never leaves the work undone: it gives way at once when no other node is ready
  (but the lease it released is left to the node it yielded to for `grace`: that node's row may
  only be late, unless a fresh one of it refuses the work), and when the lease has stayed free
  for `grace` (lease_ttl + renew_every: the ready node should have taken it by then, and two
  nodes that each yielded within a cool-off must not both wait).
  A node that gives the work up (a graceful stop, a yield back) writes its row as not ready
  before it releases, and the caller reads the rows again when the lease is free
  (runtime/readiness, `campaign_peers`): so the node it yielded to, stopping or yielding in
  turn, is no ready peer here, and the cool-off gives way at the release, not `grace` later.

No flapping: with ntfy unreachable from every node, no node is ready (each one's own probe of
ntfy fails), so no leader yields at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ntfy_intake.rules.readiness import NodeSeen, WorkState


@dataclass(frozen=True, slots=True)
class Verdict:
    """`to` is the node to yield to, None to keep leading; `reason` says why it yields ("ntfy
    unreachable from pi for 60 s"), or why it keeps leading (for the log and health); `rule`
    names the rule that decided, a word that does not change while the reason's figures do:
    working, waiting (dead, not yet for yield_after), own_term, no_peer, yield."""

    to: str | None
    reason: str
    rule: str = "yield"

    @property
    def yields(self) -> bool:
        return self.to is not None


def work_state(
    now: float,
    before: WorkState,
    *,
    latched: bool,
    intake_live: bool,
    reconnects_failing: bool,
    silent_since: float,
) -> WorkState:
    """This leader's work at `now` (module doc). `before` is what it said last (its `since`
    carries on while the state holds); `silent_since` is the last frame's instant, or the
    daemon's start before its first frame (all monotonic)."""
    if latched:
        return before if before.intake == "latched" else WorkState("latched", now)
    if not intake_live and reconnects_failing:
        return WorkState("dead", silent_since)
    if before.intake == "live" and before.since is not None:
        return before
    return WorkState("live", now)


def decide(
    now: float,
    work: WorkState,
    *,
    me: str,
    term_began: float,
    yield_after: float,
    peers: Sequence[NodeSeen],
) -> Verdict:
    """Yield or keep leading (module doc); every time monotonic, `peers` already the ready
    ones (rules/readiness.ready_peers), freshest first."""
    if work.intake == "latched":
        cause = f"the audit log cannot be written on {me} (latched)"
    elif work.intake == "dead":
        dead_for = max(0.0, now - (work.since if work.since is not None else now))
        if dead_for < yield_after:
            return Verdict(
                None,
                f"ntfy unreachable for {seconds(dead_for)}; yields after {seconds(yield_after)}",
                "waiting",
            )
        cause = f"ntfy unreachable from {me} for {seconds(dead_for)}"
    else:
        return Verdict(None, f"intake {work.intake}", "working")
    leading = now - term_began
    if leading < yield_after:
        return Verdict(
            None,
            f"{cause}; it leads for {seconds(leading)} only, and no node yields before "
            f"cluster.yield_after ({seconds(yield_after)}) in its own term",
            "own_term",
        )
    if not peers:
        return Verdict(None, f"{cause}; no other node is ready: it keeps leading", "no_peer")
    return Verdict(peers[0].node, cause)


def cooloff(
    now: float,
    until: float | None,
    *,
    peers: Sequence[NodeSeen],
    lease_free_for: float | None,
    grace: float,
    handed_to: str | None = None,
) -> str | None:
    """Why this node does not campaign now, after a yield (module doc), or None. `until` is
    the end of its cool-off (monotonic, None: never yielded); `lease_free_for` how long the
    lease has been free (None: it is held); `handed_to` the node it yielded to, while the free
    lease is still the term it released. That node was ready when the yield was decided: a
    row of it gone stale since says a busy box (two late probes), not a node that cannot take
    the work, so it has the grace to take the lease before "nobody else is ready" counts (the
    standby drill on one CPU: the yielder took its own released lease back 65 ms later)."""
    if until is None or now >= until:
        return None
    if lease_free_for is not None and lease_free_for >= grace:
        return None
    if not peers:
        if handed_to is None or lease_free_for is None:
            return None
        return f"it yielded the work to {handed_to}: the free lease is left to it for a while"
    # No countdown in the text: the campaign logs each new reason, once.
    node = peers[0].node
    return f"it yielded the work: no campaign during cluster.yield_cooloff while {node} is ready"


def seconds(value: float) -> str:
    """`60 s`: whole seconds, rounded down (the owner reads "for 60 s", never "59.98")."""
    return f"{math.floor(max(0.0, value) + 1e-9):d} s"
