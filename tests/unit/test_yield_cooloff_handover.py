"""The yielder leaves its released lease to the node it yielded to for the grace, even when
that node's row looks stale (rules/yielding.cooloff `handed_to`, runtime/yielding.Cooloff).
Named after the failure it kills: the standby drill (its nodes on one CPU) saw pi yield term 1
to nas, then take term 2 itself 65 ms later; nas's row, late by two probes on the busy box, no
longer counted as ready, so the cool-off gave way "nobody else is ready" at once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import pytest

from ntfy_intake.rules import readiness, yielding
from ntfy_intake.runtime.cluster import Member
from ntfy_intake.runtime.yielding import Cooloff

from .test_yielding import NOW, peer

GRACE = 4.0  # lease_ttl 3 + renew_every 1


@pytest.mark.parametrize(
    ("peers", "free_for", "handed_to", "held"),
    [
        ([], 0.065, "nas", True),  # released 65 ms ago, nas's row stale: nas gets the grace
        ([], 3.9, "nas", True),  # still within the grace
        ([], GRACE, "nas", False),  # free for the grace: nas did not take it, campaign
        ([], None, "nas", False),  # held (a newer term: not the released one), nobody ready
        ([], 0.065, None, False),  # another node's lease ran out: nobody ready, campaign
        ([peer()], 0.065, "nas", True),  # nas fresh and ready: as before
    ],
)
def test_the_node_yielded_to_has_the_grace_even_with_a_stale_row(
    peers: list[Any], free_for: float | None, handed_to: str | None, held: bool
) -> None:
    reason = yielding.cooloff(
        NOW, NOW + 200, peers=peers, lease_free_for=free_for, grace=GRACE, handed_to=handed_to
    )
    assert (reason is not None) is held, reason
    if reason is not None and not peers:
        assert reason.startswith("it yielded the work to nas")


class _Member:
    """What Cooloff reads of runtime/cluster.Member: the timing and the lease as last read."""

    ttl = 3.0
    renew_every = 1.0

    def __init__(self) -> None:
        self.remaining = -0.065
        self.term = 1

    def view(self) -> dict[str, Any]:
        return {"lease_remaining_s": self.remaining, "term": self.term}


def test_a_yielder_does_not_take_its_released_lease_back_while_the_target_s_row_is_late() -> None:
    clock = [100.0]
    member = _Member()
    cooloff = Cooloff(cast(Member, member), cooloff=300.0, peers=list, monotonic=lambda: clock[0])
    cooloff.began("nas", 1)
    assert cooloff() is not None  # term 1 released 65 ms ago; nas's row stale: left to nas
    member.remaining = -GRACE
    assert cooloff() is None  # nas did not take it within the grace: the work must go on
    member.remaining, member.term = 2.0, 2
    assert cooloff() is None  # nas took term 2 (and its row is stale): the usual rule
    member.remaining = -1.0
    assert cooloff() is None  # term 2 free, nobody ready: campaign at once, as before
    # A cool-off begun naming nobody: nobody ready, campaign at once, as before.
    member.remaining, member.term = -0.065, 1
    cooloff.began()
    assert cooloff() is None


def test_a_fresh_refusal_by_the_node_yielded_to_ends_its_grace_at_once() -> None:
    """A double fault: nas, yielded to, says not ready in a fresh row (its own route cut at the
    same moment). Nobody can take the work: the yielder campaigns at once instead of leaving
    the lease free for the grace (only a stale row is given the benefit of a late probe)."""
    member = _Member()
    refusing: set[str] = set()
    cooloff = Cooloff(
        cast(Member, member), cooloff=300.0, peers=list, refuses=refusing.__contains__
    )
    cooloff.began("nas", 1)
    assert cooloff() is not None  # nas's row stale: left to nas
    refusing.add("nas")
    assert cooloff() is None  # nas's fresh row refuses: campaign at once


@pytest.mark.parametrize(
    ("ready", "age", "refuses"),
    [(False, 1.0, True), (False, 60.0, False), (True, 1.0, False)],
)
def test_only_a_fresh_not_ready_row_refuses(ready: bool, age: float, refuses: bool) -> None:
    row = replace(peer(), ready=ready, seen_age_s=age)
    other = replace(peer(), node="pi", ready=False, seen_age_s=1.0)
    assert readiness.says_not_ready([row, other], row.node, probe_every=1.0) is refuses
    assert not readiness.says_not_ready([other], "nas", probe_every=1.0)
