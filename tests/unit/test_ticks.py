"""The ticker's sleep: until the earliest due time, within [floor, ceiling] (rules/ticks.py)."""

from __future__ import annotations

from ntfy_intake.rules import ticks


def test_nothing_due_sleeps_the_ceiling_not_a_fixed_short_tick() -> None:
    assert ticks.wait(100.0, [None, None], floor=0.05, ceiling=1.0) == 1.0
    assert ticks.wait(100.0, [], floor=0.05, ceiling=1.0) == 1.0


def test_a_due_time_sooner_than_the_ceiling_is_slept_until() -> None:
    slept = ticks.wait(100.0, [None, 100.3, 100.7], floor=0.05, ceiling=1.0)
    assert abs(slept - 0.3) < 1e-9


def test_a_due_time_stuck_in_the_past_never_spins() -> None:
    # A cursor that cannot be saved (the audit log latched) stays due: the floor, not 0.
    assert ticks.wait(100.0, [50.0], floor=0.05, ceiling=1.0) == 0.05


def test_a_far_due_time_waits_only_the_ceiling() -> None:
    assert ticks.wait(100.0, [160.0], floor=0.05, ceiling=1.0) == 1.0


def test_a_batch_wakes_the_ticker_only_for_a_due_time_before_its_wake_up() -> None:
    # Asleep until 101.0: the batch's cursor save at 101.0 (the deadline it set, read again a
    # hair sooner) and a later one wake nothing; a debounce window closing at 100.4 does.
    assert not ticks.sooner(100.0, [None, 101.0, 102.0], 101.0, floor=0.05)
    assert not ticks.sooner(100.0, [100.9999], 101.0, floor=0.05)
    assert ticks.sooner(100.0, [None, 100.4, 102.0], 101.0, floor=0.05)
    assert not ticks.sooner(100.0, [None, None], 101.0, floor=0.05)


def test_a_due_time_already_past_wakes_a_ticker_asleep_for_longer_than_the_floor() -> None:
    assert ticks.sooner(100.0, [99.0], 101.0, floor=0.05)
    # A pass running (no wake-up set: -inf) is never woken: its own look sees the batch.
    assert not ticks.sooner(100.0, [99.0], float("-inf"), floor=0.05)


def test_work_due_just_after_the_earliest_is_served_by_the_same_pass() -> None:
    # A cursor save at 100.30, a snapshot at 100.36: one wake-up at 100.36, not two.
    slept = ticks.wait(100.0, [100.30, None, 100.36, 101.0], floor=0.05, ceiling=30, gather=0.1)
    assert abs(slept - 0.36) < 1e-9
    # Beyond the gather window the earliest is not held back.
    slept = ticks.wait(100.0, [100.30, 100.45], floor=0.05, ceiling=30, gather=0.1)
    assert abs(slept - 0.30) < 1e-9


def test_lazy_work_waits_up_to_its_lag_for_the_pass_that_comes_anyway() -> None:
    # A frame time save due at 100.2 and a cursor save at 100.9: one pass, at 100.9.
    slept = ticks.wait(100.0, [100.9], floor=0.05, ceiling=30, lazy=[100.2], lag=1.0)
    assert abs(slept - 0.9) < 1e-9
    # No pass within its lag (nothing else due, or too far): it wakes the ticker itself.
    assert (
        abs(ticks.wait(100.0, [None], floor=0.05, ceiling=30, lazy=[100.2], lag=1.0) - 0.2) < 1e-9
    )
    slept = ticks.wait(100.0, [101.5], floor=0.05, ceiling=30, lazy=[100.2], lag=1.0)
    assert abs(slept - 0.2) < 1e-9
    # Due after the earliest pass: its own wake-up (or the gather's).
    slept = ticks.wait(100.0, [100.3], floor=0.05, ceiling=30, lazy=[100.7, None], lag=1.0)
    assert abs(slept - 0.3) < 1e-9


def test_a_batch_bringing_lazy_work_the_coming_pass_serves_wakes_nothing() -> None:
    # Asleep until 100.9 (a cursor save): a frame time save due at 100.2 waits for it.
    assert not ticks.sooner(100.0, [], 100.9, floor=0.05, lazy=[100.2], lag=1.0)
    # Asleep until 102.0: the same save would lag too long, so it wakes the ticker.
    assert ticks.sooner(100.0, [], 102.0, floor=0.05, lazy=[100.2], lag=1.0)


def test_a_cursor_never_saved_due_at_minus_infinity_does_not_crash_the_ticker() -> None:
    """A journal latched before the first cursor save left the save due at -inf (never saved +
    the save interval): the gather's `at - times[0]` was nan for every time, `max()` of nothing
    raised, the ticker task died and the daemon exited 1 (the standby drill's audit_full round).
    A time long past is due now: the floor, as any past due time."""
    inf = float("inf")
    for due in ([-inf], [-inf, 11.0], [None, -inf, 10.5]):
        assert ticks.wait(10.0, due, floor=1.0, ceiling=30.0, gather=2.0) == 1.0
    assert ticks.wait(10.0, [-inf], floor=1.0, ceiling=30.0, lazy=[-inf], lag=1.0) == 1.0
    assert ticks.sooner(10.0, [-inf], 20.0, floor=1.0)
