from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.rules.durations import MAX_SECONDS, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45s", 45.0),
        ("30m", 1800.0),
        ("12h", 43200.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("2d", 172800.0),
        ("1d2h3m4s5ms", 93784.005),
        ("1.5h", 5400.0),
        ("0.25s", 0.25),
        ("0s", 0.0),
        ("  45s\n", 45.0),
        ("3650d", MAX_SECONDS),
    ],
)
def test_parses(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("", "empty"),
        ("45", "needs a unit"),
        ("1.5", "needs a unit"),
        ("1h30", "needs a unit"),
        ("soon", "'soon'"),
        ("-5s", "'-5s'"),
        ("+5s", "'+5s'"),
        ("5 s", "'5 s'"),
        ("1h 30m", "'1h 30m'"),
        ("5S", "'5S'"),
        ("5sec", "'5sec'"),
        ("1e3s", "'1e3s'"),
        (".5s", "'.5s'"),
        ("5.s", "'5.s'"),
        ("30m1h", "largest to smallest"),
        ("1m30m", "largest to smallest"),
        ("3651d", "maximum"),
        ("9" * 400 + "d", "maximum"),
        ("٥s", "'٥s'"),  # a non-ASCII digit
        ("1h\n30m", "'1h\\n30m'"),
    ],
)
def test_rejects(text: str, hint: str) -> None:
    with pytest.raises(ValueError, match="expected a duration like 45s") as info:
        parse_duration(text)
    message = str(info.value)
    assert hint in message
    assert "\n" not in message


def test_long_input_is_cut_in_the_message() -> None:
    with pytest.raises(ValueError) as info:
        parse_duration("x" * 500)
    assert len(str(info.value)) < 120


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.0004, "0s"),
        (0.5, "500ms"),
        (45.0, "45s"),
        (112.5, "1m52s500ms"),
        (5400.0, "1h30m"),
        (43200.0, "12h"),
        (90000.0, "1d1h"),
    ],
)
def test_formats(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [-1.0, float("inf"), float("nan")])
def test_format_refuses_what_is_not_a_duration(seconds: float) -> None:
    with pytest.raises(ValueError):
        format_duration(seconds)


@given(st.integers(min_value=0, max_value=int(MAX_SECONDS * 1000)))
def test_round_trip_of_formatted_durations(milliseconds: int) -> None:
    seconds = milliseconds / 1000
    text = format_duration(seconds)
    assert parse_duration(text) == seconds
    assert format_duration(parse_duration(text)) == text


_UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}


@given(
    st.lists(st.integers(min_value=0, max_value=3000), min_size=5, max_size=5),
    st.sets(st.sampled_from(list(_UNIT_MS)), min_size=1),
)
def test_any_descending_combination_parses_to_its_sum(counts: list[int], units: set[str]) -> None:
    chosen = [unit for unit in _UNIT_MS if unit in units]  # largest first, as the grammar requires
    text = "".join(f"{count}{unit}" for count, unit in zip(counts, chosen, strict=False))
    total_ms = sum(count * _UNIT_MS[unit] for count, unit in zip(counts, chosen, strict=False))
    assert parse_duration(text) == total_ms / 1000
