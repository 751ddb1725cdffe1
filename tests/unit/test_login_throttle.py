"""Failed logins throttled (rules/login_throttle.py): the holds, their doubling, the episodes the
owner is told about once, the overall bucket and who it never holds. The clock is a number."""

from __future__ import annotations

import pytest

from ntfy_intake.rules import login_throttle
from ntfy_intake.rules.login_throttle import OVERALL, Policy, Throttle

LAN = "192.168.1.50"
OTHER = "192.168.1.51"


def fail_times(throttle: Throttle, address: str, times: list[float]) -> list[float]:
    """The hold after each failure at `times` (checked only when not held, as the surface does)."""
    holds = []
    for now in times:
        assert throttle.held(address, now) == 0, f"held at {now}: would not have been checked"
        holds.append(throttle.failed(address, now).hold)
    return holds


@pytest.mark.parametrize(
    ("times", "held_after"),
    [
        ([0, 1, 2, 3], 0.0),  # four wrong tokens: no hold
        ([0, 1, 2, 3, 4], 60.0),  # the fifth within a minute: held a minute
        ([0, 10, 20, 30, 59.5], 60.0),
        ([0, 15, 30, 45, 60], 0.0),  # five, but never five within a minute
        ([0, 1, 2, 3, 70, 71, 72, 73, 74], 60.0),
    ],
)
def test_five_wrong_tokens_in_a_minute_hold_the_address(
    times: list[float], held_after: float
) -> None:
    throttle = Throttle()
    assert fail_times(throttle, LAN, times)[-1] == held_after
    last = times[-1]
    assert throttle.held(LAN, last) == held_after
    assert throttle.held(OTHER, last) == 0  # another address is not held by this one


def test_a_held_address_waits_its_hold_then_each_failure_doubles_it_up_to_15_minutes() -> None:
    throttle = Throttle()
    now = 0.0
    fail_times(throttle, LAN, [0, 1, 2, 3, 4])
    holds = []
    for _ in range(7):
        now += throttle.held(LAN, now)  # waits out the hold (a client honouring Retry-After)
        assert throttle.held(LAN, now) == 0
        holds.append(throttle.failed(LAN, now).hold)
    assert holds == [120, 240, 480, 900, 900, 900, 900]


def test_retry_after_is_whole_seconds_and_never_zero_while_held() -> None:
    assert [login_throttle.retry_after(s) for s in (0.01, 1.0, 59.5, 900)] == [1, 1, 60, 900]


def test_the_first_hold_of_an_episode_is_reported_once_naming_the_address() -> None:
    throttle = Throttle()
    began = [throttle.failed(LAN, t).began for t in (0, 1, 2, 3, 4)]
    assert began == [(), (), (), (), ((LAN, 5),)]
    now = 4 + throttle.held(LAN, 4)
    assert throttle.failed(LAN, now).began == ()  # the next hold: the same episode, no report


def test_an_episode_ends_after_15_quiet_minutes_and_the_next_starts_at_a_minute() -> None:
    throttle = Throttle()
    fail_times(throttle, LAN, [0, 1, 2, 3, 4])  # held until 64
    quiet = 64 + 900
    assert throttle.failed(LAN, quiet - 1).hold == 120  # still on probation: doubled
    later = quiet - 1 + 120 + 900 + 1  # 15 min after that hold ended
    outcome = None
    for i in range(5):
        outcome = throttle.failed(LAN, later + i)
    assert outcome is not None
    assert outcome.hold == 60 and outcome.began == ((LAN, 5),)


def test_the_right_token_does_not_forgive_failures_on_its_address() -> None:
    """An agent's success on an address does not reset a guesser's count there: failures
    leave the count only by age."""
    throttle = Throttle()
    fail_times(throttle, LAN, [0, 1, 2, 3])
    throttle.succeeded(LAN, 5)
    assert fail_times(throttle, LAN, [6]) == [60]  # the 5th within the minute: held
    throttle2 = Throttle()
    fail_times(throttle2, LAN, [0, 1, 2, 3])
    throttle2.succeeded(LAN, 5)
    assert fail_times(throttle2, LAN, [61, 62, 63, 64]) == [0, 0, 0, 0]  # aged out


def test_an_ipv6_host_cannot_reset_its_count_by_moving_inside_its_64() -> None:
    throttle = Throttle()
    for i in range(5):
        throttle.failed(f"2001:db8:1:2::{i + 1:x}", float(i))
    assert throttle.held("2001:db8:1:2:ffff::9", 5) == 59  # held at 4 s for 60 s
    assert throttle.held("2001:db8:1:3::1", 5) == 0  # another /64
    assert login_throttle.client_key("::ffff:192.168.1.50") == LAN


def test_guesses_spread_over_many_addresses_hold_every_address_overall() -> None:
    throttle = Throttle()
    began = []
    for i in range(30):
        began += throttle.failed(f"10.0.{i}.1", float(i) / 10).began
    assert began == [(OVERALL, 30)]
    assert throttle.held("10.9.9.9", 3.0) == pytest.approx(59.9)  # held from the 30th, at 2.9 s


def test_the_overall_hold_never_locks_out_loopback_or_an_address_that_logged_in_today() -> None:
    throttle = Throttle()
    throttle.succeeded(OTHER, 0)  # the owner's laptop logged in this morning
    for i in range(30):
        throttle.failed(f"10.0.{i}.1", 1 + i / 10)
    assert throttle.held("10.9.9.9", 5) > 0
    assert throttle.held("127.0.0.1", 5) == 0
    assert throttle.held("::1", 5) == 0
    assert throttle.held(OTHER, 5) == 0
    # After a day the laptop is a stranger again: held with everyone while the overall hold is.
    trusted_until = 86400.0
    fresh = Throttle()
    fresh.succeeded(OTHER, 0)
    for i in range(30):
        fresh.failed(f"10.0.{i}.1", trusted_until + i / 10)
    assert fresh.held(OTHER, trusted_until + 5) > 0


def test_a_loopback_guesser_is_still_held_by_its_own_bucket() -> None:
    throttle = Throttle()
    fail_times(throttle, "127.0.0.1", [0, 1, 2, 3, 4])
    assert throttle.held("127.0.0.1", 5) == 59


def test_a_local_guesser_gains_nothing_by_moving_across_loopback_addresses() -> None:
    """127.0.0.0/8 is 16 million addresses a local user can connect from, each exempt from the
    overall count: they are one client."""
    throttle = Throttle()
    for i, address in enumerate(["127.0.0.2", "127.1.2.3", "::1", "::ffff:127.0.0.9", "127.9.9.9"]):
        throttle.failed(address, float(i))
    assert throttle.held("127.0.0.1", 5) == 59
    assert throttle.held("127.200.0.1", 5) == 59


def test_the_addresses_remembered_are_bounded() -> None:
    throttle = Throttle(Policy(remember=100, overall_failures=10**9))
    for i in range(1000):
        throttle.failed(f"10.{i // 250}.{i % 250}.1", 0.0)
    assert throttle.tracked() == 100


def test_a_guesser_gets_under_ten_guesses_in_the_first_half_hour() -> None:
    """The whole point: at most a handful of tokens checked per minute, fewer as it goes on."""
    throttle = Throttle()
    now, checked = 0.0, 0
    while now < 1800:
        wait = throttle.held(LAN, now)
        if wait:
            now += wait
            continue
        throttle.failed(LAN, now)
        checked += 1
        now += 0.001  # as fast as the client can go
    assert checked <= 9, checked
