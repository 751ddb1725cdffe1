"""The server-checked wall clock (issue 12, finding 6): injected local and monotonic clocks."""

from __future__ import annotations

import pytest

from ntfy_intake.runtime.clock import BOUND, TrustedClock

DAY = 86400.0
SERVER = 1_764_470_000.0


class Clocks:
    def __init__(self) -> None:
        self.local = SERVER
        self.mono = 100.0

    def trusted(self) -> TrustedClock:
        clock = TrustedClock(lambda: self.local, lambda: self.mono)
        clock.observe_server(SERVER, self.mono)
        return clock


@pytest.mark.parametrize("jump", [8 * DAY, -8 * DAY])
def test_a_local_clock_jump_is_replaced_by_server_time_and_noticed_once(jump: float) -> None:
    clocks = Clocks()
    clock = clocks.trusted()
    assert clock() == SERVER
    clocks.local += jump
    clocks.mono += 10
    assert clock() == SERVER + 10
    clocks.mono += 10
    assert clock() == SERVER + 20
    (jumped,) = clock.take_jumps()
    assert ("ahead of" if jump > 0 else "behind") in jumped and "8.0 days" in jumped
    assert clock.take_jumps() == []


def test_agreement_within_the_bound_trusts_the_local_clock() -> None:
    clocks = Clocks()
    clock = clocks.trusted()
    clocks.local += BOUND - 1
    assert clock() == SERVER + BOUND - 1
    assert clock.take_jumps() == []


def test_without_a_server_time_the_local_clock_is_all_there_is() -> None:
    clocks = Clocks()
    clocks.local += 8 * DAY
    assert TrustedClock(lambda: clocks.local, lambda: clocks.mono)() == SERVER + 8 * DAY


def test_switching_sources_never_steps_time_back_within_the_bound() -> None:
    clocks = Clocks()
    clock = clocks.trusted()
    clocks.local = SERVER + 0.9  # the Date header's one-second resolution
    assert clock() == SERVER + 0.9
    clocks.local += 8 * DAY  # jump: the server estimate (SERVER) is 0.9 s behind the last reading
    assert clock() == SERVER + 0.9
    clocks.mono += 5
    assert clock() == SERVER + 5


def test_the_local_clock_is_trusted_again_once_it_agrees() -> None:
    clocks = Clocks()
    clock = clocks.trusted()
    clocks.local -= 8 * DAY
    assert clock() == SERVER
    clocks.local = SERVER + 60  # NTP stepped it back
    clocks.mono += 60
    assert clock() == SERVER + 60
    clocks.local -= 8 * DAY  # a second jump is a second notice
    clock()
    assert len(clock.take_jumps()) == 2


def test_a_broken_date_header_is_ignored() -> None:
    clocks = Clocks()
    clock = TrustedClock(lambda: clocks.local, lambda: clocks.mono)
    clock.observe_date_header("not a date")
    clock.observe_date_header(None)
    assert clock.server_now() is None
    clock.observe_date_header("Sun, 30 Nov 2025 02:33:20 GMT")
    assert clock.server_now() == SERVER
