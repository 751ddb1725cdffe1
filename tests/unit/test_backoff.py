from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.rules import backoff


def test_exponential_then_capped() -> None:
    top = [backoff.delay(n, base=1.0, cap=60.0, rng=lambda: 1.0) for n in range(10)]
    assert top == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    low = [backoff.delay(n, base=1.0, cap=60.0, rng=lambda: 0.0) for n in range(3)]
    assert low == [0.5, 1, 2]


def test_retry_after_is_a_floor() -> None:
    assert backoff.delay(0, base=1.0, cap=60.0, rng=lambda: 0.0, retry_after=30.0) == 30.0


@given(st.integers(0, 10_000), st.floats(0, 1))
def test_delay_is_bounded(attempt: int, r: float) -> None:
    assert 0.5 <= backoff.delay(attempt, base=1.0, cap=60.0, rng=lambda: r) <= 60.0


def test_parse_retry_after_forms() -> None:
    assert backoff.parse_retry_after("7", now=0) == 7.0
    assert backoff.parse_retry_after("Thu, 01 Jan 1970 00:01:40 GMT", now=40.0) == 60.0
    assert backoff.parse_retry_after("soon", now=0) is None
    assert backoff.parse_retry_after(None, now=0) is None
    assert backoff.parse_retry_after("-5", now=0) == 0.0
