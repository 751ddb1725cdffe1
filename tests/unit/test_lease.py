"""The lease rules (rules/lease.py): the local deadline, the timing rule and what a node does
with a read of the leadership row. Each test is named after the failure it kills."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.rules.lease import (
    Action,
    LocalLease,
    Seen,
    check_timing,
    decide,
    margin,
)

TTL, EVERY = 8.0, 2.0
ME, MY_NODE = "inst-me", "pi"

durations = st.floats(min_value=0.01, max_value=600, allow_nan=False)
# One step of a leader's life: a renewal started at +gap after the last start and seen
# `latency` later, succeeded or not; or a look at the deadline at some time.
steps = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=20),
        st.floats(min_value=0, max_value=20),
        st.booleans(),
    ),
    max_size=40,
)


def held(started: float = 0.0) -> LocalLease:
    lease = LocalLease(TTL, EVERY)
    assert lease.acquired(started, started)
    return lease


# --- the timing rule ---------------------------------------------------------------------


def test_the_defaults_pass_and_a_ttl_under_three_periods_is_refused() -> None:
    assert check_timing(8, 2) is None
    assert check_timing(6, 2) is None
    problem = check_timing(5, 2)
    assert problem is not None
    assert "lease_ttl (5s) must be at least 3 x renew_every (2s)" in problem
    assert check_timing(0, 2) is not None
    assert check_timing(8, 0) is not None
    assert check_timing(float("nan"), 2) is not None


@given(durations, durations)
def test_an_accepted_timing_always_leaves_two_renewal_periods_in_the_window(
    ttl: float, every: float
) -> None:
    """Kills a margin that eats the window: with the rule's 3x, ttl - margin >= 2 periods, and
    the margin always covers one period (a loop checking once per tick stops by start + ttl)."""
    if check_timing(ttl, every) is None:
        assert ttl >= 3 * every
        assert ttl - margin(ttl, every) >= 2 * every - 1e-9
        assert margin(ttl, every) >= every
        assert margin(ttl, every) >= ttl / 4


# --- the local deadline --------------------------------------------------------------------


def test_the_deadline_counts_from_the_renewals_start_not_its_end() -> None:
    """Kills `now + ttl`: a renewal that took 3s must not give 3s more than the server did."""
    lease = held(0.0)
    assert lease.renewed(started=1.0, now=4.0)
    assert lease.deadline == 1.0 + TTL - margin(TTL, EVERY)
    assert lease.is_valid(6.999)
    assert not lease.is_valid(7.0)


def test_a_late_renewal_never_resurrects_the_lease() -> None:
    lease = held(0.0)
    deadline = lease.deadline
    assert deadline is not None
    assert not lease.renewed(started=deadline - 0.5, now=deadline + 0.01)
    assert not lease.is_valid(deadline - 0.1)  # over for good, even asked "earlier"
    assert not lease.renewed(started=deadline + 1, now=deadline + 1.1)


def test_once_invalid_a_timely_looking_renewal_does_not_bring_it_back() -> None:
    lease = held(0.0)
    assert not lease.is_valid(100.0)
    assert not lease.renewed(started=99.0, now=99.5)  # the clock says "in time": it is not
    assert lease.deadline is None


def test_a_claim_slower_than_the_window_gives_no_holding() -> None:
    lease = LocalLease(TTL, EVERY)
    assert not lease.acquired(started=0.0, now=6.5)
    assert not lease.is_valid(6.5)


def test_lapse_ends_the_holding_at_once() -> None:
    lease = held(0.0)
    lease.lapse()
    assert not lease.is_valid(0.1)
    assert not lease.renewed(0.1, 0.2)


@given(st.floats(min_value=0, max_value=1e6), steps)
def test_the_deadline_never_exceeds_a_successful_renewals_start_plus_ttl(
    start: float, history: list[tuple[float, float, bool]]
) -> None:
    """Kills any extension the server did not grant: the deadline is always at most
    (the latest start that succeeded in time) + ttl - margin, so strictly before the server's
    expiry of that renewal (set to its statement time + ttl, after the start)."""
    lease = held(start)
    last_start, granted = start, start
    for gap, latency, ok in history:
        last_start += gap
        seen_at = last_start + latency
        if ok and lease.renewed(last_start, seen_at):
            granted = max(granted, last_start)
        deadline = lease.deadline
        if deadline is not None:
            assert deadline <= granted + TTL - margin(TTL, EVERY) + 1e-9
            assert deadline < granted + TTL


@given(st.floats(min_value=0, max_value=1e6), steps)
def test_a_lease_once_invalid_stays_invalid(
    start: float, history: list[tuple[float, float, bool]]
) -> None:
    """Kills resurrection by any later renewal, however it is timed."""
    lease = held(start)
    now, lapsed = start, False
    for gap, latency, ok in history:
        now += gap
        if ok:
            lease.renewed(now, now + latency)
        valid = lease.is_valid(now + latency)
        if lapsed:
            assert not valid
        lapsed = lapsed or not valid


@given(
    st.floats(min_value=0.1, max_value=30),
    st.floats(min_value=4, max_value=20),
    st.lists(st.tuples(st.floats(min_value=0, max_value=0.99), st.booleans()), max_size=60),
)
def test_a_leader_renewing_on_time_never_loses_its_lease(
    every: float, ratio: float, renewals: list[tuple[float, bool]]
) -> None:
    """Kills a margin so large that a healthy leader flaps: with ttl >= 4 periods, renewals
    every period with a latency under one period, and never two failures in a row, the lease
    holds at every instant (checked at each renewal's start and end)."""
    ttl = every * ratio
    lease = LocalLease(ttl, every)
    assert lease.acquired(0.0, 0.0)
    previous_ok = True
    for k, (fraction, succeeds) in enumerate(renewals, start=1):
        ok = succeeds or not previous_ok  # never two failures in a row
        started = k * every
        seen = started + fraction * every
        assert lease.is_valid(started)
        if ok:
            assert lease.renewed(started, seen)
        assert lease.is_valid(seen)
        previous_ok = ok


# --- what a node does with the row -------------------------------------------------------


def seen(
    node: str = "nas",
    instance: str = "inst-other",
    term: int = 4,
    remaining: float = 5.0,
    expires_at: float = 1000.0,
) -> Seen:
    return Seen(node, instance, term, expires_at, remaining)


def choose(row: Seen | None, holding: int | None = None, first_own: Seen | None = None) -> Action:
    return decide(
        row, node=MY_NODE, instance=ME, holding=holding, renew_every=EVERY, first_own=first_own
    ).action


def test_no_row_is_taken() -> None:
    assert choose(None) is Action.TAKE


def test_my_fresh_lease_of_the_term_i_hold_is_renewed() -> None:
    assert choose(seen(MY_NODE, ME, term=4), holding=4) is Action.RENEW


def test_my_lease_after_my_deadline_passed_is_taken_as_a_new_term_not_renewed() -> None:
    """Kills sliding back into a lapsed holding: the old holding's writes must be fenced."""
    assert choose(seen(MY_NODE, ME, term=4), holding=None) is Action.TAKE
    assert choose(seen(MY_NODE, ME, term=5), holding=4) is Action.TAKE
    assert choose(seen(MY_NODE, ME, term=4, remaining=-1), holding=4) is Action.TAKE


def test_another_nodes_fresh_lease_is_watched_and_its_expired_one_taken() -> None:
    decision = decide(
        seen(remaining=0.4), node=MY_NODE, instance=ME, holding=None, renew_every=EVERY
    )
    assert decision.action is Action.STAND_BY
    assert decision.wait == pytest.approx(0.4)  # wakes at its expiry, before the next poll
    assert choose(seen(remaining=30)) is Action.STAND_BY
    assert choose(seen(remaining=0.0)) is Action.TAKE
    assert choose(seen(remaining=-3)) is Action.TAKE


def test_my_name_under_another_instance_is_waited_out_until_it_is_seen_renewing() -> None:
    """Kills both mistakes: exiting 2 on a crashed predecessor's stale lease (restart after a
    crash), and taking over a live process that uses the same name."""
    first = seen(MY_NODE, "inst-old", remaining=6, expires_at=1000.0)
    assert choose(first) is Action.WAIT_OWN
    still = seen(MY_NODE, "inst-old", remaining=2, expires_at=1000.0)
    assert choose(still, first_own=first) is Action.WAIT_OWN
    gone = seen(MY_NODE, "inst-old", remaining=-0.1, expires_at=1000.0)
    assert choose(gone, first_own=first) is Action.TAKE
    renewed = seen(MY_NODE, "inst-old", remaining=8, expires_at=1002.0)
    decision = decide(
        renewed, node=MY_NODE, instance=ME, holding=None, renew_every=EVERY, first_own=first
    )
    assert decision.action is Action.COLLISION
    assert "\n" not in decision.message
    assert "'pi' is in use" in decision.message


def test_a_different_instance_after_the_first_sighting_is_not_a_collision() -> None:
    """The predecessor died and yet another restart took the name: wait that one out too."""
    first = seen(MY_NODE, "inst-old", expires_at=1000.0)
    other = seen(MY_NODE, "inst-newer", expires_at=1005.0)
    assert choose(other, first_own=first) is Action.WAIT_OWN


def test_a_crashed_predecessor_of_my_state_directory_is_taken_at_once_not_waited_out() -> None:
    """Kills a restart after kill -9 that sits out a whole TTL: a fresh lease of an instance of
    this node's own state directory, whose lock this process now holds, is a dead process's."""
    crashed = seen(MY_NODE, "dir1.0badc0de", remaining=7)
    decision = decide(
        crashed, node=MY_NODE, instance=ME, holding=None, renew_every=EVERY, predecessor="dir1."
    )
    assert decision.action is Action.TAKE
    # Only this node's name and this directory's prefix prove death: another directory's
    # instance under my name is waited out, another node's lease is watched.
    other_dir = seen(MY_NODE, "dir2.0badc0de", remaining=7)
    assert (
        decide(
            other_dir,
            node=MY_NODE,
            instance=ME,
            holding=None,
            renew_every=EVERY,
            predecessor="dir1.",
        ).action
        is Action.WAIT_OWN
    )
    other_node = seen("nas", "dir1.0badc0de", remaining=7)
    assert (
        decide(
            other_node,
            node=MY_NODE,
            instance=ME,
            holding=None,
            renew_every=EVERY,
            predecessor="dir1.",
        ).action
        is Action.STAND_BY
    )
