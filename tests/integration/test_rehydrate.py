"""Rehydration: the cadence state comes back from the audit files, reading only the recent ones."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.rules.cadence import CadenceState, IncidentView, Policy
from ntfy_intake.rules.cadence_records import event_record, owner_record
from ntfy_intake.rules.timestamps import local_day, parse_ts
from ntfy_intake.store import audit, db, rehydrate

pytestmark = pytest.mark.engines

NOW = datetime.fromisoformat("2025-11-30T12:00:00Z").timestamp()
DAY = 86400.0


def write_lines(directory: Path, written_at: float, records: list[dict[str, Any]]) -> None:
    """Append records as the log writer does, into the file of the UTC day `written_at`."""
    with audit.AuditLog(directory, lambda: written_at) as log:
        log.append(
            [
                json.dumps({"v": 1, "seq": i, **r}, separators=(",", ":")) + "\n"
                for i, r in enumerate(records)
            ]
        )


def opened(ts: float, incident: str, severity: int = 3) -> dict[str, Any]:
    view = IncidentView(incident, severity, "firing", is_new=True)
    decision = CadenceState.empty().decide_event(Policy(), view, f"{incident}-{ts}", ts)
    return event_record(decision, view, f"{incident}-{ts}", ts)


def test_only_the_files_the_longest_window_needs_are_read(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    # Two months of old history, one file per day, each holding a request that is long over.
    for day in range(60, 2, -1):
        write_lines(directory, NOW - day * DAY, [opened(NOW - day * DAY, f"old-{day}")])
    # Traps: if these files were opened, load() would raise, or "trap" would appear in the state.
    (directory / "audit-2025-10-01.jsonl").unlink()
    (directory / "audit-2025-10-01.jsonl").mkdir()
    write_lines(directory, NOW - 10 * DAY, [opened(NOW - 600, "trap")])  # a clock-skewed record
    # The recent files: yesterday's tail and this morning.
    write_lines(directory, NOW - 2 * DAY, [opened(NOW - 2 * DAY, "two-days-ago")])
    write_lines(directory, NOW - DAY, [opened(NOW - DAY + 3600, "yesterday")])
    write_lines(directory, NOW - 600, [opened(NOW - 600, "disk", 4)])

    result = rehydrate.load(directory, Policy(), NOW)

    assert result.since_day == "2025-11-28"  # NOW - 26 h retention - 1 day of slack
    assert result.files == (
        "audit-2025-11-28.jsonl",
        "audit-2025-11-29.jsonl",
        "audit-2025-11-30.jsonl",
    )
    assert result.records == 3
    assert set(result.state.snapshot()["incidents"]) == {"disk", "yesterday"}
    decision = result.state.decide_event(
        Policy(), IncidentView("disk", 4, "firing", is_new=False), "e2", NOW
    )
    assert (decision.outcome, decision.reason) == ("suppressed", "cooldown")


def test_a_long_cooldown_reaches_further_back() -> None:
    assert rehydrate.since_day(Policy(cooldown=7 * DAY), NOW) == "2025-11-22"
    assert rehydrate.since_day(Policy(notice_window=3 * DAY), NOW) == "2025-11-26"


def test_a_missing_directory_is_an_empty_state(tmp_path: Path) -> None:
    result = rehydrate.load(tmp_path / "nothing", Policy(), NOW)
    assert (result.files, result.records) == ((), 0)
    assert result.state.snapshot() == {
        **CadenceState.empty().snapshot(),
        "clock": "2025-11-30T12:00:00.000Z",
    }


def test_the_windowed_load_equals_folding_the_whole_history(tmp_path: Path) -> None:
    """Eight days of traffic; at several restart instants the recent files give the full state."""
    directory = tmp_path / "audit"
    policy = Policy(daily_cap=3, timezone="Europe/Amsterdam", notice_limit=2)
    state = CadenceState.empty(policy)
    incidents: dict[str, int] = {}
    start = NOW - 8 * DAY
    step = 0
    while (now := start + step * 1037.25) < NOW:  # an event every ~17 minutes
        key = f"incident-{step % 5}"
        severity = max(incidents.get(key, 0), 1 + step % 4)
        status = "resolved" if step % 7 == 0 else "firing"
        view = IncidentView(key, severity, status, is_new=key not in incidents)  # type: ignore[arg-type]
        incidents[key] = severity
        decision = state.decide_event(policy, view, f"e{step}", now)
        records = [event_record(decision, view, f"e{step}", now, topic="alerts")]
        if decision.outcome == "triage_requested":
            reply = state.decide_owner_message(policy, now + 30)
            records.append(
                owner_record(
                    f"notify:{decision.delivery_key}",
                    now + 30,
                    message_kind="triage",
                    result=reply.result,
                    reason=reply.reason,
                )
            )
        if step % 11 == 0:
            notice = state.decide_notice(policy, "gap", now + 31)
            records.append(
                owner_record(
                    f"gap:{step}",
                    now + 31,
                    message_kind="notice",
                    notice="gap",
                    result=notice.result,
                )
            )
        for record in records:
            state.apply(record)
        write_lines(directory, now + 45, records)  # flushed a little later, sometimes the next day
        step += 1

    for restart in (NOW, NOW + 3 * 3600, NOW + DAY + 1, NOW + 5 * DAY):
        loaded = rehydrate.load(directory, policy, restart)
        full = CadenceState.empty(policy)
        for record in audit.read_records(directory):
            full.apply(record)
        full.prune(restart)
        assert loaded.state.snapshot() == full.snapshot()
        assert len(loaded.files) <= 4 < len(audit.log_files(directory))
    assert rehydrate.load(directory, policy, NOW).state.snapshot()["incidents"]


# -- the seed incident: a capped alert got through three times because redeploys wiped memory ---


def stage(conn: db.Connection, record: dict[str, Any], now: float) -> None:
    """What the inbox/relay transactions will do: journal the record, commit, then apply."""
    fields = {k: v for k, v in record.items() if k not in ("ts", "kind")}
    with db.write_txn(conn):
        audit.stage(conn, record["kind"], now, **fields)


def run_incidents(
    conn: db.Connection,
    directory: Path,
    policy: Policy,
    times: list[float],
    *,
    rehydrate_state: bool,
) -> list[dict[str, Any]]:
    for number, now in enumerate(times):
        # A redeploy before every alert: a new process, a new state.
        state = (
            rehydrate.load(directory, policy, now).state
            if rehydrate_state
            else CadenceState.empty(policy)
        )
        view = IncidentView(f"incident-{number}", 4, "firing", is_new=True)
        decision = state.decide_event(policy, view, f"e{number}", now)
        stage(conn, event_record(decision, view, f"e{number}", now, topic="alerts"), now)
        reply_at = now + policy.debounce + 20  # the agent answers after the window closed
        reply = state.decide_owner_message(policy, reply_at)
        record = owner_record(
            f"notify:{decision.delivery_key}",
            reply_at,
            message_kind="triage",
            result=reply.result,
            reason=reply.reason,
        )
        stage(conn, record, reply_at)
        with audit.AuditLog(directory, lambda at=reply_at: at + 1) as log:
            audit.flush(conn, log)
    return list(audit.read_records(directory))


def test_the_daily_cap_holds_across_restarts(store: db.Connection, tmp_path: Path) -> None:
    policy = Policy(daily_cap=2, timezone="Europe/Amsterdam")
    times = [NOW + 3600 * i for i in range(5)]
    records = run_incidents(store, tmp_path / "audit", policy, times, rehydrate_state=True)

    triaged = [r for r in records if r["kind"] == "event" and r["outcome"] == "triage_requested"]
    messages = Counter(
        (r["result"], r.get("reason")) for r in records if r["kind"] == "owner_message"
    )
    assert len(triaged) == 5  # past the cap, triage still happens
    assert messages == {("queued", None): 2, ("suppressed", "daily_cap"): 3}  # and is audited

    # The next local day (Amsterdam midnight is 23:00Z in winter) opens a fresh allowance.
    tomorrow = datetime.fromisoformat("2025-11-30T23:00:00Z").timestamp()
    state = rehydrate.load(tmp_path / "audit", policy, tomorrow).state
    assert state.decide_owner_message(policy, tomorrow).allowed
    assert not state.decide_owner_message(policy, tomorrow - 0.001).allowed


def test_without_rehydration_the_seed_incident_comes_back(
    store: db.Connection, tmp_path: Path
) -> None:
    policy = Policy(daily_cap=2)
    times = [NOW + 3600 * i for i in range(5)]
    records = run_incidents(store, tmp_path / "audit", policy, times, rehydrate_state=False)
    queued = [r for r in records if r["kind"] == "owner_message" and r["result"] == "queued"]
    assert len(queued) == 5  # what memory-only cadence did on redeploy day
    assert {local_day(parse_ts(r["ts"]) or 0.0, "UTC") for r in queued} == {local_day(NOW, "UTC")}
