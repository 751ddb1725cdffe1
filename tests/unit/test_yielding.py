"""When a leader yields the work (rules/yielding.py) and how its cool-off reads the lease
(runtime/yielding.Cooloff), as tables on an injected clock: no sleep.

Each row is a moment of a leader's term: its work (live, dead since when, latched), when its
term began, the ready peers; the verdict is to yield (to whom, saying why) or to keep leading.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from ntfy_intake.rules import notices, yielding
from ntfy_intake.rules.readiness import NodeSeen, WorkState
from ntfy_intake.runtime.cluster import Member
from ntfy_intake.runtime.yielding import Cooloff

YIELD_AFTER = 60.0
NOW = 10_000.0
TERM_BEGAN = NOW - 600.0  # a term well past yield_after, unless a row says otherwise


def peer(node: str = "nas", seen_age_s: float = 1.0) -> NodeSeen:
    return NodeSeen(
        node=node,
        instance=f"{node}.1",
        ready=True,
        reason=None,
        fingerprint="f",
        parts={},
        version="1",
        schema_known=True,
        seen_age_s=seen_age_s,
        intake="standby",
        intake_age_s=None,
    )


def decide(
    work: WorkState, peers: list[NodeSeen], term_began: float = TERM_BEGAN, now: float = NOW
) -> yielding.Verdict:
    return yielding.decide(
        now, work, me="pi", term_began=term_began, yield_after=YIELD_AFTER, peers=peers
    )


@pytest.mark.parametrize(
    ("work", "peers", "term_began", "to", "reason_part"),
    [
        # The work goes on: nothing to yield, whoever is ready.
        (WorkState("live", NOW - 3600), [peer()], TERM_BEGAN, None, "intake live"),
        # Dead, but not yet for yield_after: reconnects may still succeed.
        (WorkState("dead", NOW - 59.9), [peer()], TERM_BEGAN, None, "yields after 60 s"),
        # Dead for yield_after while a peer is ready: yield to it, naming the silence.
        (
            WorkState("dead", NOW - 60.0),
            [peer()],
            TERM_BEGAN,
            "nas",
            "ntfy unreachable from pi for 60 s",
        ),
        # Dead for longer: the reason says how long.
        (WorkState("dead", NOW - 95.5), [peer()], TERM_BEGAN, "nas", "for 95 s"),
        # Latched: no wait of its own once a peer is ready (the latch lasts until a restart).
        (WorkState("latched", NOW - 0.1), [peer()], TERM_BEGAN, "nas", "latched"),
        # Dead for ever but nobody else can work: keep leading, and say so.
        (WorkState("dead", NOW - 900), [], TERM_BEGAN, None, "no other node is ready"),
        (WorkState("latched", NOW - 900), [], TERM_BEGAN, None, "no other node is ready"),
        # A node that just took over does not hand the work straight back, dead or latched.
        (WorkState("dead", NOW - 900), [peer()], NOW - 59.0, None, "in its own term"),
        (WorkState("latched", NOW - 1), [peer()], NOW - 10.0, None, "in its own term"),
        # ... and does once yield_after has passed in its term.
        (WorkState("dead", NOW - 900), [peer()], NOW - 60.0, "nas", "for 900 s"),
        # Several ready: the freshest first (ready_peers' order), as given.
        (WorkState("dead", NOW - 70), [peer("nuc"), peer("nas")], TERM_BEGAN, "nuc", "70 s"),
    ],
)
def test_a_leader_yields_only_when_its_work_is_dead_or_latched_and_another_node_is_ready(
    work: WorkState, peers: list[NodeSeen], term_began: float, to: str | None, reason_part: str
) -> None:
    verdict = decide(work, peers, term_began)
    assert verdict.to == to
    assert verdict.yields is (to is not None)
    assert (verdict.rule == "yield") is (to is not None)
    assert reason_part in verdict.reason


def test_ntfy_unreachable_from_both_nodes_never_moves_the_lease_back_and_forth() -> None:
    """The no-flapping case, played on a clock: pi leads, ntfy unreachable from pi AND from nas,
    so nas's own probe fails and it is not ready. Over ten yield_after periods pi never yields;
    the moment nas's probe succeeds (ready), pi yields once."""
    term_began = 0.0
    dead = WorkState("dead", 0.0)
    verdicts = [decide(dead, [], term_began, now=t) for t in range(0, 601, 5)]
    assert not any(v.yields for v in verdicts)
    assert "no other node is ready" in verdicts[-1].reason
    # What keeps it, as the log tells it once per change: waiting, then nobody ready.
    rules = [v.rule for v in verdicts]
    assert sorted(set(rules), key=rules.index) == ["waiting", "no_peer"]
    assert decide(dead, [peer()], term_began, now=605.0).to == "nas"


def test_the_node_that_took_over_waits_its_own_yield_after_before_yielding_back() -> None:
    """pi yielded to nas at t=100; nas at once finds ntfy dead too (its last frame older than
    yield_after) while pi, no longer cut, probes ready: nas keeps the work until yield_after has
    passed in ITS term, so the lease moves at most once per yield_after."""
    nas_term = 100.0
    dead_long = WorkState("dead", 0.0)
    for t in (100.0, 130.0, 159.9):
        verdict = yielding.decide(
            t, dead_long, me="nas", term_began=nas_term, yield_after=60.0, peers=[peer("pi")]
        )
        assert not verdict.yields, t
    verdict = yielding.decide(
        160.0, dead_long, me="nas", term_began=nas_term, yield_after=60.0, peers=[peer("pi")]
    )
    assert verdict.to == "pi"


@pytest.mark.parametrize(
    ("before", "latched", "live", "failing", "silent_since", "want"),
    [
        # Frames fresh: live, since it was first seen live.
        (WorkState(), False, True, False, 90.0, WorkState("live", 100.0)),
        (WorkState("live", 50.0), False, True, False, 90.0, WorkState("live", 50.0)),
        # Not live, but no reconnect failed yet (the first attempt after a clean drop): live.
        (WorkState("live", 50.0), False, False, False, 90.0, WorkState("live", 50.0)),
        # Silent and a reconnect failed: dead since the last frame.
        (WorkState("live", 50.0), False, False, True, 90.0, WorkState("dead", 90.0)),
        # An error after the last frame, but frames fresh again: live from now.
        (WorkState("dead", 20.0), False, True, True, 99.0, WorkState("live", 100.0)),
        # Latched, whatever intake does: since first seen latched.
        (WorkState("dead", 20.0), True, False, True, 90.0, WorkState("latched", 100.0)),
        (WorkState("latched", 70.0), True, True, False, 90.0, WorkState("latched", 70.0)),
    ],
)
def test_work_state_reads_the_health_models_notions(
    before: WorkState,
    latched: bool,
    live: bool,
    failing: bool,
    silent_since: float,
    want: WorkState,
) -> None:
    got = yielding.work_state(
        100.0,
        before,
        latched=latched,
        intake_live=live,
        reconnects_failing=failing,
        silent_since=silent_since,
    )
    assert got == want


@pytest.mark.parametrize(
    ("until", "peers", "free_for", "held"),
    [
        (None, [peer()], None, False),  # never yielded
        (NOW + 200, [peer()], None, True),  # cooling off while nas is ready and leads
        (NOW + 200, [peer()], 1.0, True),  # released a second ago: nas is about to take it
        (NOW + 200, [], None, False),  # nobody else ready: the cool-off gives way
        (NOW + 200, [peer()], 4.0, False),  # free for the grace: nas did not take it
        (NOW, [peer()], None, False),  # the cool-off is over
    ],
)
def test_cooloff_holds_the_campaign_only_while_another_node_is_ready(
    until: float | None, peers: list[NodeSeen], free_for: float | None, held: bool
) -> None:
    reason = yielding.cooloff(NOW, until, peers=peers, lease_free_for=free_for, grace=4.0)
    assert (reason is not None) is held
    if reason is not None:
        assert reason.endswith("while nas is ready")


def test_the_yield_notice_names_both_nodes_and_the_reason_under_the_next_terms_key() -> None:
    notice = notices.yielded("pi", "nas", "ntfy unreachable from pi for 60 s", 7)
    assert notice.text.startswith("pi yielded to nas: ntfy unreachable from pi for 60 s.")
    # The next leader's own takeover notice for term 8 is then a no-op: one notice, not two.
    assert notice.key == notices.takeover("nas", "pi", 8, 7).key


class _Member:
    """What Cooloff reads of runtime/cluster.Member: the timing and the lease as last read."""

    ttl = 3.0
    renew_every = 1.0

    def __init__(self) -> None:
        self.remaining: float | None = 2.0

    def view(self) -> dict[str, Any]:
        return {"lease_remaining_s": self.remaining}


def test_cooloff_gives_the_lease_back_when_the_ready_node_did_not_take_it() -> None:
    """After a yield the node holds off while nas is ready and the lease is held or only just
    released; once it has stayed free for lease_ttl + renew_every (4 s) the cool-off gives way,
    so two nodes that each yielded never both wait while nobody leads."""
    clock = [100.0]
    member = _Member()
    ready = [peer()]
    cooloff = Cooloff(
        cast(Member, member), cooloff=300.0, peers=lambda: ready, monotonic=lambda: clock[0]
    )
    assert cooloff() is None  # never yielded
    cooloff.began()
    assert cooloff() is not None  # nas leads (the lease is fresh)
    member.remaining = -3.9
    assert cooloff() is not None  # released 3.9 s ago: nas is about to take it
    member.remaining = -4.0
    assert cooloff() is None  # free for the grace: campaign
    member.remaining = 2.0
    ready.clear()
    assert cooloff() is None  # nobody else ready
    ready.append(peer())
    clock[0] = 400.0
    assert cooloff() is None  # the cool-off is over
