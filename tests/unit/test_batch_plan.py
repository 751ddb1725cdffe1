"""The inbox batch's decisions as tables, with no database: debounce, cooldown, escalation,
resolve, a window the outbox closed, device actions, unknown kinds, duplicates and conflicts,
and what the planner asks the store to read (rules/batch_plan.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.rules import batch_plan, cadence, incidents
from ntfy_intake.rules.batch_plan import Answers, Conflict, Note, Plan
from ntfy_intake.rules.cadence import CadenceState, Policy
from ntfy_intake.rules.timestamps import quantize
from ntfy_intake.store import audit, outbox
from ntfy_intake.wire import frames
from ntfy_intake.wire.frames import DeviceAction, Ignored, Message

TOPICS = frozenset({"alerts"})
T0 = 1_764_470_000
NOW = float(T0 + 30) + 0.123456
POLICY = Policy(debounce=120.0, cooldown=3600.0)


def _frame(**fields: Any) -> Any:
    obj: dict[str, Any] = {"time": T0, "expires": T0 + 43200, "topic": "alerts", **fields}
    return frames.decode_line(json.dumps(obj).encode(), TOPICS)


def msg(event_id: str, title: str = "Disk full", **fields: Any) -> Message:
    frame = _frame(id=event_id, event="message", title=title, message="m", **fields)
    assert isinstance(frame, Message), frame
    return frame


def envelope(event_id: str, status: str, severity: int) -> Message:
    body = json.dumps({"incident": "db primary", "status": status, "severity": severity})
    frame = _frame(id=event_id, event="message", message=body)
    assert isinstance(frame, Message), frame
    return frame


def action(event_id: str, kind: str, sequence: str) -> DeviceAction:
    frame = _frame(id=event_id, event=kind, sequence_id=sequence)
    assert isinstance(frame, DeviceAction), frame
    return frame


def decide(
    batch: list[Any],
    *,
    now: float = NOW,
    state: CadenceState | None = None,
    answers: Answers | None = None,
) -> Plan:
    """The store's three steps without a store: `answers` stand for what it read (an incident
    it was asked for and `answers` lack is not recorded yet)."""
    planner = batch_plan.Planner(POLICY, now)
    events = [f for f in batch if isinstance(f, Message | DeviceAction | Ignored)]
    messages = [e for e in events if isinstance(e, Message)]
    planner.asks(events, messages, [e for e in events if isinstance(e, DeviceAction)])
    answers = answers or Answers()
    planner.still_needed(answers)
    for key in planner.asked:
        answers.incidents.setdefault(key, None)
    planner.start(answers, state or CadenceState.empty(POLICY))
    for index, frame in enumerate(batch):
        if isinstance(frame, Message):
            planner.message(index, frame)
        elif isinstance(frame, DeviceAction):
            planner.action(index, frame)
        elif isinstance(frame, Ignored):
            planner.ignored(index, frame)
        else:
            planner.aside(frame)
    return planner.plan


def outcomes(plan: Plan) -> list[tuple[str, str]]:
    return [(row.outcome, row.reason) for row in plan.rows]


def opened(first: Message | None = None) -> tuple[Plan, Answers]:
    """A request opened by `first` at NOW: the plan, and what a later batch reads back."""
    first = first or msg("aaaaaaaaaaa1")
    plan = decide([first])
    answers = Answers(
        windows={r.delivery_key for r in plan.requests},
        incidents=dict(plan.incidents),
        sequences={(first.topic, first.sequence): plan.rows[0].incident_key},
    )
    return plan, answers


# -- debounce, cooldown, escalation, resolve ---------------------------------------------------


@pytest.mark.parametrize(
    ("later", "priority", "window_open", "expected"),
    [
        (0.0, 3, True, ("joined", "debounce")),
        (119.999, 3, True, ("joined", "debounce")),
        (120.0, 3, True, ("suppressed", "cooldown")),  # the window closed: the cooldown holds
        (120.0, 5, True, ("triage_requested", "escalation")),
        (3599.0, 3, False, ("suppressed", "cooldown")),
        (3600.0, 3, False, ("triage_requested", "repeat")),  # the cooldown is over
        (60.0, 3, False, ("triage_requested", "window_closed")),  # the outbox released it
    ],
)
def test_a_second_event_of_an_incident_is_decided_by_its_windows(
    later: float, priority: int, window_open: bool, expected: tuple[str, str]
) -> None:
    first, answers = opened()
    if not window_open:
        answers.windows = set()
    second = decide(
        [msg("aaaaaaaaaaa2", priority=priority)],
        now=NOW + later,
        state=first.state,
        answers=answers,
    )
    assert outcomes(second) == [expected]


def test_a_burst_in_one_batch_is_one_request_whose_window_is_the_debounce() -> None:
    plan = decide([msg(f"aaaaaaaaaa{i:02d}") for i in range(5)])
    (request,) = plan.requests
    assert request == ("tri_aaaaaaaaaa00", "alerts:disk full", "new_incident", request.due_at)
    assert request.due_at == cadence.debounce_end(quantize(NOW), POLICY.debounce)
    assert outcomes(plan) == [("triage_requested", "new_incident")] + [("joined", "debounce")] * 4
    assert plan.attach == [("tri_aaaaaaaaaa00", f"aaaaaaaaaa{i:02d}") for i in range(5)]
    assert plan.incidents["alerts:disk full"].events == 5


def test_a_window_the_outbox_closed_reopens_on_the_same_grid_as_every_window() -> None:
    """A join whose request is no longer collecting (a wall clock stepped back) opens a fresh
    request; its window is `debounce_end`'s, like every other (it was `now + debounce`)."""
    first, answers = opened()
    answers.windows = set()
    plan = decide([msg("aaaaaaaaaaa2")], now=NOW + 1.0004, state=first.state, answers=answers)
    (request,) = plan.requests
    assert request.reason == "window_closed"
    assert request.due_at == cadence.debounce_end(quantize(NOW + 1.0004), POLICY.debounce)


@pytest.mark.parametrize(
    ("status", "severity", "later", "expected"),
    [
        ("resolved", 2, 200.0, ("triage_requested", "resolved")),
        ("firing", 5, 200.0, ("suppressed", "cooldown")),  # same severity, same status
        ("resolved", 2, 60.0, ("joined", "debounce")),  # inside the window it joins
        ("resolved", 2, 3600.0, ("triage_requested", "resolved")),  # a fresh episode, resolved
    ],
)
def test_a_resolve_opens_a_request_past_the_debounce(
    status: str, severity: int, later: float, expected: tuple[str, str]
) -> None:
    first, answers = opened(envelope("aaaaaaaaaaa1", "firing", 5))
    plan = decide(
        [envelope("aaaaaaaaaaa2", status, severity)],
        now=NOW + later,
        state=first.state,
        answers=answers,
    )
    assert outcomes(plan) == [expected]
    assert plan.incidents["db primary"].status == status


# -- device actions and kinds the daemon does not know -----------------------------------------


def test_every_device_action_kind_of_the_wire_is_worded_for_agents() -> None:
    """The kinds are named once (frames.DEVICE_ACTIONS); a new one must be worded here."""
    assert set(batch_plan.DEVICE_ACTION_WORDS) == set(frames.DEVICE_ACTIONS)


@pytest.mark.parametrize("kind", frames.DEVICE_ACTIONS)
def test_a_device_action_is_noted_on_its_messages_incident_and_decides_nothing(kind: str) -> None:
    head = msg("seqaaaaaaa01")
    plan = decide([head, action("dddddddddd01", kind, "seqaaaaaaa01")])
    assert [row.event for row in plan.rows] == ["message", kind]
    noted = plan.rows[1]
    assert (noted.incident_key, noted.outcome, noted.delivery_key) == (
        "alerts:disk full",
        "noted",
        None,
    )
    assert noted.reason.startswith(f"{kind}: message seqaaaaaaa01 ")
    assert len(plan.requests) == 1 and plan.incidents["alerts:disk full"].events == 1
    assert plan.records[1]["incident"] == "alerts:disk full"


def test_a_delete_before_its_message_is_unlinked_until_the_message_links_it() -> None:
    early = decide([action("dddddddddd01", "message_delete", "seqaaaaaaa01")])
    assert early.rows[0].incident_key == "" and "incident" not in early.records[0]
    later = decide([msg("seqaaaaaaa01")])
    assert later.links == [("alerts:disk full", "alerts", "seqaaaaaaa01")]


@pytest.mark.parametrize(
    ("state", "noted"),
    [("collecting", False), ("pending", True), ("delivered", True), (None, True)],
)
def test_a_late_delete_reaches_agents_unless_its_request_still_collects(
    state: str | None, noted: bool
) -> None:
    answers = Answers(
        sequences={("alerts", "seqaaaaaaa01"): "alerts:disk full"},
        requests={("alerts", "seqaaaaaaa01"): ("tri_seqaaaaaaa01", state)},
    )
    plan = decide([action("dddddddddd01", "message_clear", "seqaaaaaaa01")], answers=answers)
    notes = [a.item for a in plan.asides if isinstance(a.item, Note)]
    assert len(notes) == noted
    if noted:
        assert notes[0].payload["delivery_key"] == "tri_seqaaaaaaa01"


def test_an_unknown_kind_is_ignored_never_a_cursor_and_folds_nothing() -> None:
    frame = _frame(id="pppppppppp01", event="poll_request")
    assert isinstance(frame, Ignored)
    state = CadenceState.empty(POLICY)
    plan = decide([frame], state=state)
    assert outcomes(plan) == [("ignored", "unknown event kind 'poll_request'")]
    assert [c.cached for c in plan.candidates] == [False]
    assert plan.state.snapshot()["clock"] is None


# -- duplicates, conflicts, what the store is asked --------------------------------------------


def test_a_known_id_is_a_duplicate_and_a_changed_body_a_conflict() -> None:
    same, changed = msg("aaaaaaaaaaa1"), msg("aaaaaaaaaaa2")
    answers = Answers(known={same.id: same.raw_sha256, changed.id: "another body"})
    plan = decide([same, changed, msg("aaaaaaaaaaa3")], answers=answers)
    assert (plan.recorded, plan.duplicates, plan.conflicts) == (1, 1, 1)
    assert [c.event_id for c in plan.candidates] == ["aaaaaaaaaaa1", "aaaaaaaaaaa3"]
    (conflict,) = [a.item for a in plan.asides]
    assert isinstance(conflict, Conflict) and conflict.event is changed


def test_a_conflict_is_a_known_id_with_another_body_unless_rebuilt_without_one() -> None:
    same, changed, rebuilt, new = (msg(f"aaaaaaaaaaa{i}") for i in range(1, 5))
    planner = batch_plan.Planner(POLICY, NOW)
    batch = [same, changed, rebuilt, new]
    planner.asks(batch, batch, [])
    answers = Answers(
        known={
            same.id: same.raw_sha256,
            changed.id: "another body",
            rebuilt.id: batch_plan.REBUILT_UNKNOWN_SHA256,
        }
    )
    assert planner.conflicts(answers) == [changed]


def test_a_live_batch_asks_its_incidents_ahead_and_a_backlog_only_for_new_events() -> None:
    live = [msg("aaaaaaaaaaa1")]
    planner = batch_plan.Planner(POLICY, NOW)
    asks = planner.asks(live, live, [])
    assert (asks.incidents, asks.windows) == (["alerts:disk full"], True)
    backlog = [msg(f"dup{i:09d}", title=f"probe {i}") for i in range(40)]
    planner = batch_plan.Planner(POLICY, NOW)
    assert planner.asks(backlog, backlog, []).incidents == []
    known = Answers(known={m.id: m.raw_sha256 for m in backlog})
    assert planner.still_needed(known) == []


def test_an_update_under_a_new_title_asks_its_sequences_incident() -> None:
    update = msg("aaaaaaaaaaa2", title="Disk fine", sequence_id="seqaaaaaaa01")
    planner = batch_plan.Planner(POLICY, NOW)
    assert planner.asks([update], [update], []).sequences == ["seqaaaaaaa01"]
    answers = Answers(sequences={("alerts", "seqaaaaaaa01"): "alerts:disk full"})
    assert planner.still_needed(answers) == ["alerts:disk full"]


def test_an_incident_the_store_was_not_asked_for_is_a_lookup_error() -> None:
    planner = batch_plan.Planner(POLICY, NOW, speculate_at_most=0)
    planner.start(Answers(), CadenceState.empty(POLICY))
    with pytest.raises(LookupError, match="not read"):
        planner.message(0, msg("aaaaaaaaaaa1"))


# -- one record shape, one fold ----------------------------------------------------------------


def test_the_planners_fold_is_the_replays_fold_of_its_records() -> None:
    """Live and replay fold the same records with the same `apply`: a restart rebuilds what the
    live batch left."""
    batch = [msg(f"aaaaaaaaaa{i:02d}", title=f"t{i % 3}", priority=2 + i % 3) for i in range(9)]
    batch.append(action("dddddddddd01", "message_delete", "aaaaaaaaaa00"))
    plan = decide(batch)
    replayed = CadenceState.empty(POLICY)
    for line in [audit.encode(record) for record in plan.records]:
        replayed.apply(json.loads(line))
    assert replayed.snapshot() == plan.state.snapshot()
    assert plan.state.snapshot()["incidents"]  # something was folded


def test_an_event_record_holds_what_the_row_holds() -> None:
    plan = decide([msg("aaaaaaaaaaa1", sequence_id="seqaaaaaaa01")])
    (row,), (record,) = plan.rows, plan.records
    assert list(record) == [
        "ts",
        "kind",
        "event_id",
        "incident",
        "severity",
        "status",
        "outcome",
        "reason",
        "delivery_key",
        "topic",
        "time",
        "expires",
        "sequence_id",
        "sha256",
    ]
    assert (record["incident"], record["outcome"], record["delivery_key"]) == (
        row.incident_key,
        row.outcome,
        row.delivery_key,
    )
    assert incidents.normalise_title("Disk full") in record["incident"]


def test_the_store_names_no_device_action_kind_and_its_sql_takes_every_one() -> None:
    """A new ntfy event kind is named in frames.DEVICE_ACTIONS (and worded in batch_plan); the
    release's SQL had the kinds as a literal of its own, copied by hand."""
    store = Path(outbox.__file__).parent
    naming = sorted(
        path.name
        for path in store.glob("*.py")
        for text in _code_strings(path.read_text())
        for kind in frames.DEVICE_ACTIONS
        if kind in text
    )
    assert naming == []
    for kind in frames.DEVICE_ACTIONS:
        assert f"'{kind}'" in outbox._ACTIONS


def _code_strings(source: str) -> list[str]:
    """The string constants of a module, its docstrings left out (prose may name a kind)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


@pytest.mark.parametrize(
    ("waiting_before", "batch_has_early_delete", "links_written"),
    [(False, False, False), (True, False, True), (False, True, True)],
)
def test_links_are_written_only_when_a_delete_may_wait_for_its_message(
    waiting_before: bool, batch_has_early_delete: bool, links_written: bool
) -> None:
    """SQLite's probe (is any delete/clear waiting?) is read with the batch's reads, not in
    its write; a delete of this batch that comes before its message waits too."""
    batch: list[Any] = [msg("seqaaaaaaa01")]
    if batch_has_early_delete:
        batch.insert(0, action("dddddddddd01", "message_delete", "seqaaaaaaa01"))
    plan = decide(batch, answers=Answers(unlinked=waiting_before))
    assert plan.links == [("alerts:disk full", "alerts", "seqaaaaaaa01")]
    assert plan.unlinked is links_written
