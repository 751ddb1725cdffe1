"""The pure since parser, as a table (ntfy-spec.md section 2.1; checklist items 12, 16, 17, 19)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.testbed.emulator.params import Params
from ntfy_intake.testbed.emulator.since import (
    ALL,
    LATEST,
    NONE,
    InvalidSince,
    Since,
    parse_go_duration,
    parse_since,
    valid_message_id,
)

NOW_S = 1_700_000_000
NOW_NS = NOW_S * 1_000_000_000 + 250_000_000  # a quarter second past NOW_S

S = 1_000_000_000


@pytest.mark.parametrize(
    ("value", "poll", "expected"),
    [
        ("", False, NONE),
        ("", True, ALL),
        ("all", False, ALL),
        ("none", True, NONE),
        ("latest", False, LATEST),
        ("abcdefABCDEF", False, Since(0, "abcdefABCDEF")),
        ("123456789012", False, Since(0, "123456789012")),  # 12 digits: an id, not a timestamp
        ("0", False, ALL),  # since=0 is the "all" marker
        ("1", False, NONE),  # since=1 is the "none" marker
        ("2", False, Since(2)),
        ("1700000000", False, Since(1_700_000_000)),
        ("-5", False, Since(-5)),
        ("+7", False, Since(7)),
        ("1700000000000", False, Since(1_700_000_000_000)),  # 13-digit ms: far future seconds
        ("10s", False, Since(NOW_S - 10)),
        ("100ms", False, Since(NOW_S)),  # now - 0.1 s, truncated to the second
        ("300ms", False, Since(NOW_S - 1)),  # floor, not round
        ("1h30m", False, Since(NOW_S - 5400)),
        ("1.5h", False, Since(NOW_S - 5400)),
        (".5m", False, Since(NOW_S - 30)),
        ("-5m", False, Since(NOW_S + 300)),
        ("+5m", False, Since(NOW_S - 300)),
        ("2\u00b5s", False, Since(NOW_S)),
        ("2\u03bcs", False, Since(NOW_S)),
        ("7ns", False, Since(NOW_S)),
        ("5us", False, Since(NOW_S)),
    ],
)
def test_since_table(value: str, poll: bool, expected: Since) -> None:
    assert parse_since(value, poll=poll, now_ns=NOW_NS) == expected


@pytest.mark.parametrize(
    "value",
    [
        "ALL",
        "Latest",
        "NONE",
        "1d",  # item 12: days are not Go duration syntax
        "hwQ2YpKdmg",  # item 17: a legacy 10-character id
        "abcdefABCDE!",
        "abcdefABCDEFG",
        "INVALID",
        "1.5",
        "5 s",
        "5S",
        "1_000",
        ".s",
        "-",
        "+",
        "s",
        "10s ",  # the caller trims; an untrimmed value is invalid here
        "\uff11\uff10s",  # full-width digits are not ASCII digits
        "99999999999999999999",  # overflows int64 and has no unit
        "9999999999999999999h",  # duration overflow
    ],
)
def test_since_rejects(value: str) -> None:
    with pytest.raises(InvalidSince):
        parse_since(value, poll=False, now_ns=NOW_NS)


def test_marker_predicates() -> None:
    assert Since(0).is_all() and Since(1).is_none() and LATEST.is_latest()
    assert Since(0, "abcdefABCDEF").is_id() and not LATEST.is_id() and not ALL.is_id()


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        ("0", 0),
        ("-0", 0),
        ("1h", 3600 * S),
        ("1h30m45s", 5445 * S),
        ("1.000000001s", S + 1),
        ("2562047h47m16.854775807s", (1 << 63) - 1),
        ("-2562047h47m16.854775808s", -(1 << 63)),
    ],
)
def test_go_duration_table(value: str, ns: int) -> None:
    assert parse_go_duration(value) == ns


def test_min_int64_duration_wraps_like_go() -> None:
    """Go negates math.MinInt64 back to itself, so this one means "long ago", i.e. everything."""
    marker = parse_since("-2562047h47m16.854775808s", poll=False, now_ns=NOW_NS)
    assert marker.time < 0


@pytest.mark.parametrize("value", ["2562047h47m16.854775808s", "1", "1.s.", "1m1"])
def test_go_duration_rejects(value: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_go_duration(value)


@given(
    st.integers(min_value=0, max_value=10**6), st.sampled_from(["ns", "us", "ms", "s", "m", "h"])
)
def test_duration_integer_units(number: int, unit: str) -> None:
    scale = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": S, "m": 60 * S, "h": 3600 * S}[unit]
    assert parse_go_duration(f"{number}{unit}") == number * scale
    assert parse_go_duration(f"-{number}{unit}") == -number * scale


@given(st.text(max_size=20))
def test_parse_since_total(value: str) -> None:
    """Any string is either a marker or InvalidSince, never another exception."""
    with contextlib.suppress(InvalidSince):
        parse_since(value, poll=False, now_ns=NOW_NS)


@given(st.text(alphabet="abcXYZ019", min_size=12, max_size=12))
def test_any_twelve_alphanumerics_are_an_id(value: str) -> None:
    assert valid_message_id(value)
    assert parse_since(value, poll=False, now_ns=NOW_NS) == Since(0, value)


@pytest.mark.parametrize(
    ("headers", "query", "value"),
    [
        ({"X-Since": "all"}, {"since": "none"}, "all"),  # a header beats the query
        ({"Si": " 10s "}, {}, "10s"),  # any header name, trimmed
        ({"since": "   "}, {"since": "latest"}, "latest"),  # a blank header falls through
        ({}, {"Since": "all"}, ""),  # query keys are lowercase only
        ({}, {"si": "all", "since": "none"}, "none"),  # name order: x-since, since, si
        ({}, {"x-since": " ", "since": "all"}, ""),  # a blank query value ends the search
    ],
)
def test_since_is_read_like_read_param(
    headers: dict[str, str], query: dict[str, str], value: str
) -> None:
    assert Params(headers, query).get("x-since", "since", "si") == value
