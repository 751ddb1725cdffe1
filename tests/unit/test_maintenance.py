"""Maintenance windows, the pure rule: wall-clock meaning across daylight-saving changes,
midnight-crossing windows, day names, topic and incident patterns, and the cadence decision that
suppresses an owner message with reason `maintenance:<name>`. Every instant is given; nothing
reads a clock."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ntfy_intake.rules import cadence, cadence_records, maintenance, silences, timestamps
from ntfy_intake.rules.maintenance import DAY_NAMES, END_OF_DAY, Window

AMS = "Europe/Amsterdam"
NYC = "America/New_York"


def minutes(text: str) -> int:
    if text == "24:00":
        return END_OF_DAY
    hours, mins = text.split(":")
    return int(hours) * 60 + int(mins)


def window(
    start: str,
    end: str,
    *,
    days: str = "daily",
    zone: str = AMS,
    topics: tuple[str, ...] = ("*",),
    incidents: tuple[str, ...] = (),
    name: str = "w",
) -> Window:
    chosen = range(7) if days == "daily" else (DAY_NAMES.index(d) for d in days.split(","))
    return Window(name, topics, incidents, frozenset(chosen), minutes(start), minutes(end), zone)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# (case, window, UTC instant, holds). The DST nights of 2026:
# Amsterdam springs 02:00 CET -> 03:00 CEST on Sun 29 March (01:00Z) and falls back 03:00 CEST ->
# 02:00 CET on Sun 25 October (01:00Z); New York springs 02:00 EST -> 03:00 EDT on Sun 8 March
# (07:00Z) and falls back 02:00 EDT -> 01:00 EST on Sun 1 November (06:00Z).
SPRING_AMS = window("01:30", "03:30", days="sun")  # 01:30 CET (00:30Z) to 03:30 CEST (01:30Z)
FALL_AMS = window("01:30", "03:30", days="sun")  # 01:30 CEST (23:30Z) to 03:30 CET (02:30Z)
SPRING_NYC = window("01:30", "03:30", days="sun", zone=NYC)  # 06:30Z to 07:30Z
FALL_NYC = window(
    "01:30", "03:30", days="sun", zone=NYC
)  # 01:30 EDT (05:30Z) to 03:30 EST (08:30Z)
CASES = [
    # A plain week: the local wall clock, in winter and in summer.
    ("winter sunday opens at 01:00Z", SPRING_AMS, "2026-01-11T00:30:00", True),
    ("winter sunday before", SPRING_AMS, "2026-01-11T00:29:59", False),
    ("winter sunday closes", SPRING_AMS, "2026-01-11T02:30:00", False),
    ("summer sunday opens at 23:30Z", SPRING_AMS, "2026-07-04T23:30:00", True),
    ("summer sunday last second", SPRING_AMS, "2026-07-05T01:29:59", True),
    ("not on a monday", SPRING_AMS, "2026-01-12T00:30:00", False),
    # Spring forward, Amsterdam: 1 h of real time.
    ("ams spring opens 01:30 CET", SPRING_AMS, "2026-03-29T00:30:00", True),
    ("ams spring before", SPRING_AMS, "2026-03-29T00:29:59", False),
    ("ams spring at the jump", SPRING_AMS, "2026-03-29T01:00:00", True),
    ("ams spring last second", SPRING_AMS, "2026-03-29T01:29:59", True),
    ("ams spring closes 03:30 CEST", SPRING_AMS, "2026-03-29T01:30:00", False),
    # Fall back, Amsterdam: 3 h of real time, opening the evening before in UTC.
    ("ams fall opens 01:30 CEST", FALL_AMS, "2026-10-24T23:30:00", True),
    ("ams fall before", FALL_AMS, "2026-10-24T23:29:59", False),
    ("ams fall first 02:xx", FALL_AMS, "2026-10-25T00:30:00", True),
    ("ams fall second 02:xx", FALL_AMS, "2026-10-25T01:30:00", True),
    ("ams fall last second", FALL_AMS, "2026-10-25T02:29:59", True),
    ("ams fall closes 03:30 CET", FALL_AMS, "2026-10-25T02:30:00", False),
    # New York, both nights.
    ("nyc spring opens 01:30 EST", SPRING_NYC, "2026-03-08T06:30:00", True),
    ("nyc spring last second", SPRING_NYC, "2026-03-08T07:29:59", True),
    ("nyc spring closes 03:30 EDT", SPRING_NYC, "2026-03-08T07:30:00", False),
    ("nyc fall opens 01:30 EDT", FALL_NYC, "2026-11-01T05:30:00", True),
    ("nyc fall before", FALL_NYC, "2026-11-01T05:29:59", False),
    ("nyc fall repeated 01:30 EST", FALL_NYC, "2026-11-01T06:30:00", True),
    ("nyc fall last second", FALL_NYC, "2026-11-01T08:29:59", True),
    ("nyc fall closes 03:30 EST", FALL_NYC, "2026-11-01T08:30:00", False),
    # An edge in the skipped hour is the instant of the jump.
    (
        "from skipped 02:30: not before the jump",
        window("02:30", "04:00"),
        "2026-03-29T00:59:59",
        False,
    ),
    (
        "from skipped 02:30: opens at the jump",
        window("02:30", "04:00"),
        "2026-03-29T01:00:00",
        True,
    ),
    ("to skipped 02:30: holds to the jump", window("01:00", "02:30"), "2026-03-29T00:59:59", True),
    (
        "to skipped 02:30: closes at the jump",
        window("01:00", "02:30"),
        "2026-03-29T01:00:00",
        False,
    ),
    (
        "inside the skipped hour: never that night",
        window("02:15", "02:45"),
        "2026-03-29T01:00:00",
        False,
    ),
    (
        "inside the skipped hour: just before",
        window("02:15", "02:45"),
        "2026-03-29T00:59:59",
        False,
    ),
    (
        "inside the skipped hour: the next night",
        window("02:15", "02:45"),
        "2026-03-30T00:30:00",
        True,
    ),
    (
        "nyc from skipped 02:00 opens at the jump",
        window("02:00", "04:00", zone=NYC),
        "2026-03-08T07:00:00",
        True,
    ),
    (
        "nyc from skipped 02:00 not before",
        window("02:00", "04:00", zone=NYC),
        "2026-03-08T06:59:59",
        False,
    ),
    # An edge in the repeated hour is its first pass.
    ("repeated hour, first pass", window("02:15", "02:45"), "2026-10-25T00:30:00", True),
    ("repeated hour, second pass", window("02:15", "02:45"), "2026-10-25T01:30:00", False),
    (
        "nyc repeated hour, first pass",
        window("01:15", "01:45", zone=NYC),
        "2026-11-01T05:30:00",
        True,
    ),
    (
        "nyc repeated hour, second pass",
        window("01:15", "01:45", zone=NYC),
        "2026-11-01T06:30:00",
        False,
    ),
    # Crossing midnight: the day it starts.
    (
        "sun 23:00-02:00 on sunday night",
        window("23:00", "02:00", days="sun"),
        "2026-01-11T22:30:00",
        True,
    ),
    (
        "sun 23:00-02:00 into monday",
        window("23:00", "02:00", days="sun"),
        "2026-01-12T00:30:00",
        True,
    ),
    (
        "sun 23:00-02:00 closes monday 02:00",
        window("23:00", "02:00", days="sun"),
        "2026-01-12T01:00:00",
        False,
    ),
    (
        "sun 23:00-02:00 not sunday small hours",
        window("23:00", "02:00", days="sun"),
        "2026-01-11T00:30:00",
        False,
    ),
    (
        "sun 23:00-02:00 not monday night",
        window("23:00", "02:00", days="sun"),
        "2026-01-12T22:30:00",
        False,
    ),
    (
        "sat 23:00-03:30 across spring forward",
        window("23:00", "03:30", days="sat"),
        "2026-03-29T01:29:59",
        True,
    ),
    (
        "sat 23:00-03:30 closes 03:30 CEST",
        window("23:00", "03:30", days="sat"),
        "2026-03-29T01:30:00",
        False,
    ),
    # The whole day, 23 h and 25 h long on the changing days.
    (
        "00:00-24:00 the spring sunday",
        window("00:00", "24:00", days="sun"),
        "2026-03-29T21:59:59",
        True,
    ),
    (
        "00:00-24:00 ends at monday",
        window("00:00", "24:00", days="sun"),
        "2026-03-29T22:00:00",
        False,
    ),
    (
        "00:00-24:00 the fall sunday",
        window("00:00", "24:00", days="sun"),
        "2026-10-25T22:59:59",
        True,
    ),
    (
        "00:00-24:00 begins at sunday",
        window("00:00", "24:00", days="sun"),
        "2026-10-24T21:59:59",
        False,
    ),
    # Day names.
    (
        "mon,wed on a wednesday",
        window("09:00", "10:00", days="mon,wed"),
        "2026-01-14T08:30:00",
        True,
    ),
    (
        "mon,wed not on a tuesday",
        window("09:00", "10:00", days="mon,wed"),
        "2026-01-13T08:30:00",
        False,
    ),
    ("daily on a thursday", window("09:00", "10:00"), "2026-01-15T08:30:00", True),
]


@pytest.mark.parametrize(("case", "chosen", "instant", "holds"), CASES, ids=[c[0] for c in CASES])
def test_window_holds_by_the_local_wall_clock(
    case: str, chosen: Window, instant: str, holds: bool
) -> None:
    found = maintenance.active([chosen], topic="alerts", incident_key=None, now_utc=utc(instant))
    assert (found is chosen) is holds, case


def test_spring_forward_window_lasts_one_hour_and_fall_back_three() -> None:
    spring = SPRING_AMS.span(datetime(2026, 3, 29).date())
    fall = FALL_AMS.span(datetime(2026, 10, 25).date())
    assert spring[1] - spring[0] == timedelta(hours=1)
    assert fall[1] - fall[0] == timedelta(hours=3)
    assert SPRING_NYC.span(datetime(2026, 3, 8).date()) == (
        utc("2026-03-08T06:30:00"),
        utc("2026-03-08T07:30:00"),
    )


# (case, window, topic, incident key, holds)
MATCHES = [
    ("topic pattern", window("00:00", "24:00", topics=("nas*",)), "nas1", None, True),
    (
        "topic pattern, another topic",
        window("00:00", "24:00", topics=("nas*",)),
        "web",
        None,
        False,
    ),
    (
        "topic pattern is case-sensitive",
        window("00:00", "24:00", topics=("nas*",)),
        "NAS1",
        None,
        False,
    ),
    ("topic ? is one character", window("00:00", "24:00", topics=("nas?",)), "nas12", None, False),
    ("topic [seq]", window("00:00", "24:00", topics=("nas[12]",)), "nas2", None, True),
    (
        "incident pattern",
        window("00:00", "24:00", topics=(), incidents=("backup:*",)),
        "nas",
        "backup:nightly job",
        True,
    ),
    (
        "incident pattern, another incident",
        window("00:00", "24:00", topics=(), incidents=("backup:*",)),
        "backup",
        "nas:backup",
        False,
    ),
    (
        "incident pattern, no incident key",
        window("00:00", "24:00", topics=(), incidents=("*",)),
        "nas",
        None,
        False,
    ),
    (
        "either topic or incident",
        window("00:00", "24:00", topics=("web",), incidents=("nas:*",)),
        "other",
        "nas:disk",
        True,
    ),
    ("no topic, no incident", window("00:00", "24:00"), None, None, False),
]


@pytest.mark.parametrize(
    ("case", "chosen", "topic", "key", "holds"), MATCHES, ids=[m[0] for m in MATCHES]
)
def test_window_matches_topics_and_incident_patterns(
    case: str, chosen: Window, topic: str | None, key: str | None, holds: bool
) -> None:
    now = utc("2026-01-11T12:00:00")
    assert (
        maintenance.active([chosen], topic=topic, incident_key=key, now_utc=now) is chosen
    ) is holds


def test_holding_checks_every_topic_of_a_message_and_answers_in_configuration_order() -> None:
    now = utc("2026-01-11T12:00:00")
    first = window("00:00", "24:00", topics=("db",), name="first")
    second = window("00:00", "24:00", topics=("nas",), name="second")
    third = window("00:00", "24:00", topics=("web", "nas"), name="third")
    assert (
        maintenance.holding(
            [first, second, third], topics=("web", "nas"), incident_key=None, now_utc=now
        )
        is second
    )
    assert (
        maintenance.holding([first], topics=("web", "nas"), incident_key=None, now_utc=now) is None
    )
    closed = window("15:00", "16:00", topics=("nas",), name="closed")
    assert (
        maintenance.holding([closed, third], topics=("nas",), incident_key=None, now_utc=now)
        is third
    )
    assert maintenance.holding([], topics=("nas",), incident_key="x", now_utc=now) is None


def test_next_opening_and_describe_for_the_console() -> None:
    backup = window("01:00", "04:00", days="sun", name="backup")
    assert backup.describe() == "sun 01:00-04:00 Europe/Amsterdam"
    assert window("22:00", "24:00").describe() == "daily 22:00-24:00 Europe/Amsterdam"
    # Saturday noon in winter: the next Sunday 01:00 CET.
    assert backup.next_opening(utc("2026-01-10T12:00:00")) == utc("2026-01-11T00:00:00")
    # While it holds, the next opening is a week on.
    assert backup.next_opening(utc("2026-01-11T01:00:00")) == utc("2026-01-18T00:00:00")
    assert backup.holding_span(utc("2026-01-11T01:00:00")) == (
        utc("2026-01-11T00:00:00"),
        utc("2026-01-11T03:00:00"),
    )
    # A window wholly inside a skipped hour does not open that night: the next is a week on.
    skipped = window("02:15", "02:45", days="sun")
    assert skipped.next_opening(utc("2026-03-28T12:00:00")) == utc("2026-04-05T00:15:00")


POLICY = cadence.Policy(
    daily_cap=1,
    maintenance=(
        window("01:00", "04:00", days="sun", topics=("backup", "nas*"), name="sunday-backup"),
    ),
)
SUNDAY_2AM = utc("2026-01-11T01:00:00").timestamp()  # 02:00 CET
SUNDAY_5AM = utc("2026-01-11T04:00:00").timestamp()


def test_owner_message_inside_a_window_is_suppressed_with_reason_maintenance_name() -> None:
    state = cadence.CadenceState.empty(POLICY)
    decision = state.decide_owner_message(
        POLICY, SUNDAY_2AM, incident="nas1:disk", topics=("nas1",)
    )
    assert (decision.allowed, decision.reason) == (False, "maintenance:sunday-backup")
    other = state.decide_owner_message(POLICY, SUNDAY_2AM, incident="web:down", topics=("web",))
    assert other.allowed
    later = state.decide_owner_message(POLICY, SUNDAY_5AM, incident="nas1:disk", topics=("nas1",))
    assert later.allowed


def test_maintenance_suppression_does_not_use_up_the_daily_cap() -> None:
    state = cadence.CadenceState.empty(POLICY)
    held = state.decide_owner_message(POLICY, SUNDAY_2AM, incident="nas1:disk", topics=("nas1",))
    state.apply(
        cadence_records.owner_record(
            "notify:tri_a",
            SUNDAY_2AM,
            message_kind="triage",
            result=held.result,
            reason=held.reason,
        )
    )
    assert state.decide_owner_message(
        POLICY, SUNDAY_5AM, incident="nas1:disk", topics=("nas1",)
    ).allowed


def test_a_silence_is_named_before_a_window_and_a_window_before_the_cap() -> None:
    state = cadence.CadenceState.empty(POLICY)
    state.apply(
        {
            "ts": timestamps.rfc3339(SUNDAY_2AM - 60),
            "kind": "silence",
            **silences.silence_fields("sil_a", "topic", "nas1", SUNDAY_2AM + 60, ""),
        }
    )
    assert (
        state.decide_owner_message(POLICY, SUNDAY_2AM, incident="k", topics=("nas1",)).reason
        == "silenced"
    )
    capped = cadence.Policy(daily_cap=0, maintenance=POLICY.maintenance)
    empty = cadence.CadenceState.empty(capped)
    assert empty.decide_owner_message(capped, SUNDAY_2AM, topics=("backup",)).reason == (
        "maintenance:sunday-backup"
    )
    assert empty.decide_owner_message(capped, SUNDAY_5AM, topics=("backup",)).reason == "daily_cap"


def test_no_windows_change_nothing() -> None:
    plain = cadence.Policy(daily_cap=5)
    state = cadence.CadenceState.empty(plain)
    assert state.decide_owner_message(
        plain, SUNDAY_2AM, incident="nas1:disk", topics=("nas1",)
    ).allowed


def brute_span(chosen: Window, day: date) -> tuple[datetime, datetime]:
    """The same definition, the slow way: scan UTC minutes for the first at which the local
    wall clock reads each edge or later."""
    zone = ZoneInfo(chosen.timezone)
    start_wall = datetime(day.year, day.month, day.day) + timedelta(minutes=chosen.start)
    end = chosen.end if chosen.end > chosen.start else chosen.end + END_OF_DAY
    end_wall = datetime(day.year, day.month, day.day) + timedelta(minutes=end)
    scan = datetime(day.year, day.month, day.day, tzinfo=UTC) - timedelta(days=1)
    found: list[datetime] = []
    for wall in (start_wall, end_wall):
        while scan.astimezone(zone).replace(tzinfo=None) < wall:
            scan += timedelta(minutes=1)
        found.append(scan)
    return found[0], max(found)


# Days around each zone's 2026 changes, and one plain day. Lord Howe moves by 30 minutes.
DST_DAYS = {
    AMS: [date(2026, 3, 29), date(2026, 10, 25), date(2026, 6, 1)],
    NYC: [date(2026, 3, 8), date(2026, 11, 1), date(2026, 6, 1)],
    "Australia/Lord_Howe": [date(2026, 4, 5), date(2026, 10, 4), date(2026, 6, 1)],
}


@settings(max_examples=150, deadline=None)
@given(
    zone=st.sampled_from(sorted(DST_DAYS)),
    which=st.integers(0, 2),
    start=st.integers(0, 24 * 4 - 1).map(lambda q: q * 15),
    end=st.integers(1, 24 * 4).map(lambda q: q * 15),
)
def test_span_is_the_first_instant_the_wall_clock_reads_each_edge(
    zone: str, which: int, start: int, end: int
) -> None:
    assume(start != end)
    day = DST_DAYS[zone][which]
    chosen = Window("w", ("*",), (), frozenset(range(7)), start, end, zone)
    assert chosen.span(day) == brute_span(chosen, day)
