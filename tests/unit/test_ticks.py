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
