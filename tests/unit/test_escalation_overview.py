"""rules/escalation.overview: escalations shown apart from the agent's messages in `status` and
on the console (DESIGN.md section 13): the day's count against `escalate_daily_cap` as the
cadence counts it, the held ones, the newest, and what escalates next. Time injected.

Each test is named after the failure it kills.
"""

from __future__ import annotations

from dataclasses import replace

from ntfy_intake.rules import escalation

from .test_escalation import POLICY, request

# 2025-11-30 23:30 UTC: already Monday 00:30 in Amsterdam (UTC+1 in winter).
NOW = 1_764_545_400.0
AMSTERDAM = "Europe/Amsterdam"


def recorded(
    key: str, at: float, state: str = "sent", reason: str | None = None
) -> escalation.Recorded:
    return escalation.Recorded(key, state, at, reason, "nas:disk")


def test_day_count_is_the_caps_day_in_the_cadence_timezone_not_utcs() -> None:
    """Failure mode: the owner reads "0 of 5 today" at 00:30 local time while the cap, which
    counts by the local day, already holds yesterday's (UTC's today) — or the reverse."""
    rows = [
        recorded("escalate:a", NOW - 45 * 60),  # 23:45 local, Sunday: yesterday
        recorded("escalate:b", NOW - 10 * 60),  # 00:20 local, Monday: today
        recorded("escalate:c", NOW - 5 * 60, "pending"),
        recorded("escalate:d", NOW - 60, "suppressed", "escalate_daily_cap"),
    ]
    view = escalation.overview(POLICY, AMSTERDAM, rows, [], NOW)
    assert (view.today, view.held_today) == (2, 1)
    assert view.last is not None and view.last.key == "escalate:d"
    assert view.last.reason == "escalate_daily_cap"
    assert escalation.overview(POLICY, "UTC", rows, [], NOW).today == 3


def test_upcoming_lists_what_escalates_next_soonest_first_and_nothing_that_cannot() -> None:
    later = request("tri_late", released_at=NOW - 60)
    sooner = request("tri_soon", released_at=NOW - 500)
    low = request("tri_low", released_at=NOW - 500, severity=3)
    answered = request("tri_done", released_at=NOW - 500, delivered=True)
    view = escalation.overview(POLICY, AMSTERDAM, [], [later, low, sooner, answered], NOW)
    assert [(r.delivery_key, due) for r, due in view.upcoming] == [
        ("tri_soon", NOW + 100),
        ("tri_late", NOW + 540),
    ]
    assert view.last is None and view.today == 0


def test_upcoming_is_bounded_so_a_flood_does_not_fill_the_status() -> None:
    flood = [replace(request(f"tri_{n:03}"), released_at=NOW - n) for n in range(50)]
    view = escalation.overview(POLICY, AMSTERDAM, [], flood, NOW)
    assert len(view.upcoming) == escalation.UPCOMING_SHOWN
    assert view.upcoming[0][0].delivery_key == "tri_049"
