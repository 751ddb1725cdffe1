"""The leader's yield, run (DESIGN.md section 11): a leader that cannot do the work and a node
that can swap places, gracefully, and the owner hears of it once.

The rules are rules/yielding.py's; this module gives them the daemon's state, a clock and a
task. Three parts, composed by runtime/node.py:
- `WorkWatch`: this node's work as its readiness row stores it at each probe (the standbys'
  health reads it there): the term's daemon's (`latched`, `dead`, `live`, from the one health
  model: the audit latch, the intake's frames and failures) while it leads, `standby` between
  terms;
- `watch_term`: runs for the whole of a term (node.py's `_lead`) and returns once the rule says
  yield, after recording the owner's notice under this term (below); node.py then stops the
  daemon as at SIGTERM (a drain under the still-valid term), releases the lease with its
  NOTIFY, starts the cool-off and stands by, in the same process, as after a lost lease;
- `Cooloff`: composed into `Member.hold_off`; after a yield this node leaves the lease to the
  ready node (rules/yielding.cooloff says for how long and when it gives way). Its peers are
  `Prober.campaign_peers`: read again when the lease is free, so a node that released it
  (its row written "stopped" or "yielded" first) no longer counts as ready.

The notice, exactly once: it is recorded under the yielding leader's term, before the drain and
the release, with the NEXT term's takeover key (rules/notices.yielded). The owner outbox keeps
one row per key, so whichever of the two comes first is the one the owner reads: recorded,
the next leader's own takeover notice for that term is a no-op (whether the yielder then
released, or crashed and its lease ran out); not recorded (a crash before it, the database
gone), the yield did not happen as far as the store knows, and the next leader's takeover
notice tells the owner of the failover. It goes out through the owner outbox: a yielder whose
route to ntfy is cut cannot send it, the next leader does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from ntfy_intake.flow.intake import IntakeHealth
from ntfy_intake.flow.journal import Journal
from ntfy_intake.flow.pipeline import CrashPoints
from ntfy_intake.rules import notices
from ntfy_intake.rules import yielding as rules
from ntfy_intake.rules.health import State
from ntfy_intake.rules.readiness import NodeSeen, WorkState
from ntfy_intake.runtime.cluster import Holding, Member
from ntfy_intake.runtime.vitals import Vitals

log = structlog.get_logger("ntfy_intake.cluster")

CHECK_EVERY_MAX = 1.0  # seconds between two looks at the work during a term


class Working(Protocol):
    """What the watch reads of a term's daemon (runtime/daemon.Daemon has them)."""

    @property
    def vitals(self) -> Vitals: ...
    @property
    def health(self) -> IntakeHealth: ...
    @property
    def journal(self) -> Journal: ...
    @property
    def crash(self) -> CrashPoints: ...


class WorkWatch:
    """This node's work (module doc); called by the readiness probe and the term's watch, on
    the event loop."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._daemon: Working | None = None
        self._state = WorkState()

    def leading(self, daemon: Working | None) -> None:
        """A term's daemon from now (None: the term is over, this node stands by)."""
        self._daemon = daemon
        self._state = WorkState()

    def __call__(self) -> WorkState:
        daemon = self._daemon
        if daemon is None:
            return WorkState("standby")
        assessed = daemon.vitals.assess_health()
        last_frame = daemon.health.last_frame_at
        self._state = rules.work_state(
            self._monotonic(),
            self._state,
            latched=daemon.journal.latched,
            intake_live=assessed.intake is State.LIVE,
            reconnects_failing=assessed.error_current,
            silent_since=daemon.vitals.liveness.started_at if last_frame is None else last_frame,
        )
        return self._state


async def watch_term(
    daemon: Working,
    holding: Holding,
    *,
    work: Callable[[], WorkState],
    peers: Callable[[], Sequence[NodeSeen]],
    yield_after: float,
    term_began: float,
    record_within: float,
    monotonic: Callable[[], float] = time.monotonic,
) -> rules.Verdict:
    """Until the rule says yield (module doc): then the notice, recorded under this term (at
    most `record_within` seconds: the work matters more than the notice), and the verdict."""
    check_every = min(CHECK_EVERY_MAX, yield_after / 10)
    said = "working"
    while True:
        state, ready = work(), list(peers())
        verdict = rules.decide(
            monotonic(),
            state,
            me=holding.node,
            term_began=term_began,
            yield_after=yield_after,
            peers=ready,
        )
        if verdict.yields:
            break
        if verdict.rule not in (said, "working"):
            # Once per change of the rule that keeps it (dead, not yet for yield_after; no ready
            # node; its own term too young): health says the rest, the log says why.
            log.warning("cluster.keeps_leading", node=holding.node, reason=verdict.reason)
        said = verdict.rule
        await asyncio.sleep(check_every)
    assert verdict.to is not None
    log.warning(
        "cluster.yielding",
        node=holding.node,
        to=verdict.to,
        term=holding.term,
        reason=verdict.reason,
    )
    notice = notices.yielded(holding.node, verdict.to, verdict.reason, holding.term)
    try:
        async with asyncio.timeout(record_within):
            await daemon.journal.note(notice)
    except Exception as exc:  # noqa: BLE001 - the next leader's takeover notice stands in (doc)
        log.error("cluster.yield_notice_failed", node=holding.node, error=repr(exc))
    daemon.crash.hit("after_yield_notice")  # test hook: a crash between the notice and the release
    return verdict


class Cooloff:
    """After a yield, why this node does not campaign (rules/yielding.cooloff), for
    `Member.hold_off`: asked in the lease thread, right after it read the lease row."""

    def __init__(
        self,
        member: Member,
        *,
        cooloff: float,
        peers: Callable[[], Sequence[NodeSeen]],
        refuses: Callable[[str], bool] = lambda node: False,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._member = member
        self._cooloff = cooloff
        self._peers = peers
        self._refuses = refuses  # a node's fresh row says not ready (Prober.says_not_ready)
        self._monotonic = monotonic
        # The ready node campaigns within renew_every of the release NOTIFY; a lease still free
        # after a whole ttl more was not taken by it, and must not stay free.
        self._grace = member.ttl + member.renew_every
        self.until: float | None = None
        self._handed: tuple[str, int] | None = None  # (to whom, the term it released)

    def began(self, to: str | None = None, term: int | None = None) -> None:
        """The cool-off starts, after a yield of `term` to node `to` (rules/yielding.cooloff:
        that node has the grace to take the released lease even if its row looks stale)."""
        self.until = self._monotonic() + self._cooloff
        self._handed = None if to is None or term is None else (to, term)

    def __call__(self) -> str | None:
        if self.until is None:
            return None
        view = self._member.view()
        remaining = view["lease_remaining_s"]
        free_for = None if remaining is None or remaining > 0 else -float(remaining)
        peers = self._peers()  # first: with the lease free it reads the rows again
        handed = self._handed
        # Still the term it released (no node took a newer one): the node it yielded to,
        # unless its fresh row refuses the work (a stale one may only be a late probe).
        to = handed[0] if handed is not None and view.get("term") == handed[1] else None
        if to is not None and self._refuses(to):
            to = None
        return rules.cooloff(
            self._monotonic(),
            self.until,
            peers=peers,
            lease_free_for=free_for,
            grace=self._grace,
            handed_to=to,
        )
