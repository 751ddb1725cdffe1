"""rules/probe_backoff: a refused ntfy token is not sent again every probe (adversary finding:
a standby's stale token spent ntfy's per-address failed-login budget, 30 and one back a minute,
and locked the leader behind the same address out). Time is injected."""

from __future__ import annotations

import itertools

from ntfy_intake.rules import probe_backoff
from ntfy_intake.rules.probe_backoff import Backoff


def refusals_in(seconds: float, probe_every: float = 10.0) -> list[float]:
    """When a probe every `probe_every` sends a token ntfy refuses every time, for `seconds`."""
    state, sent, now = Backoff(), [], 0.0
    while now < seconds:
        if state.due(now):
            sent.append(now)
            state = probe_backoff.refused(state, now)
        now += probe_every
    return sent


def test_a_refused_token_waits_1_2_4_minutes_and_never_more_than_30() -> None:
    state, waits = Backoff(), []
    for _ in range(8):
        state = probe_backoff.refused(state, 1000.0)
        waits.append(state.wait(1000.0))
    assert waits == [60.0, 120.0, 240.0, 480.0, 960.0, 1800.0, 1800.0, 1800.0]


def test_a_refused_token_stays_far_under_ntfy_s_failed_login_budget() -> None:
    """ntfy: 30 failed logins per address, one back a minute. The probe's refusals in any
    window never reach a third of the burst, and after the first hour 2 an hour (60 come back)."""
    day = refusals_in(24 * 3600.0)
    assert len(refusals_in(3600.0)) == 6
    for start in day:
        in_window = [t for t in day if start <= t < start + 3600.0]
        assert len(in_window) <= 6
    later = [t for t in day if t >= 3 * 3600.0]
    assert all(b - a >= 1800.0 for a, b in itertools.pairwise(later))


def test_an_accepted_token_resets_the_wait() -> None:
    state = probe_backoff.refused(probe_backoff.refused(Backoff(), 0.0), 60.0)
    assert not state.due(100.0)
    state = probe_backoff.accepted()
    assert state.due(100.0) and state.wait(100.0) == 0.0
    assert probe_backoff.refused(state, 100.0).wait(100.0) == 60.0


def test_only_a_refusal_of_the_credentials_backs_off() -> None:
    assert probe_backoff.is_refusal(401, "40101 unauthorized")
    assert probe_backoff.is_refusal(403, "40301 forbidden")
    assert probe_backoff.is_refusal(429, "42909 limit reached: too many auth failures")
    assert not probe_backoff.is_refusal(429, "42901 limit reached: too many requests")
    assert not probe_backoff.is_refusal(500, None)
    assert not probe_backoff.is_refusal(200, None)
