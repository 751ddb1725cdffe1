"""The planner under `ntfy.profiles` (rules/batch_plan.py, `cadence.Policy.profiles`), with no
database: both of its ways to sign a message (a live batch ahead, a backlog once its duplicates
are known) obey the setting, and the `event` record names the profile that keyed the message.

The failure these kill: the planner asked the profiles whatever the setting said.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ntfy_intake.rules import batch_plan
from ntfy_intake.rules.batch_plan import Answers, Plan
from ntfy_intake.rules.cadence import CadenceState, Policy
from ntfy_intake.store import audit
from ntfy_intake.wire import frames
from ntfy_intake.wire.frames import Message

from .. import publishers

T0 = 1_764_470_000
NOW = float(T0 + 30)


def kuma(event_id: str, payload: dict[str, Any], at: int) -> Message:
    obj = {**payload, "id": event_id, "time": at, "expires": at + 43200, "event": "message"}
    frame = frames.decode_line(json.dumps(obj).encode(), frozenset({"alerts"}))
    assert isinstance(frame, Message), frame
    return frame


BATCH = [
    kuma("kumadown0001", publishers.KUMA_DOWN, T0),
    kuma("kumaup000001", publishers.KUMA_UP, T0 + 1),
    kuma("plain0000001", {"topic": "alerts", "title": "Disk full", "message": "97%"}, T0),
]


def decide(policy: Policy, *, speculate_at_most: int) -> Plan:
    planner = batch_plan.Planner(policy, NOW, speculate_at_most=speculate_at_most)
    planner.asks(BATCH, BATCH, [])
    answers = Answers()
    planner.still_needed(answers)
    for key in planner.asked:
        answers.incidents.setdefault(key, None)
    planner.start(answers, CadenceState.empty(policy))
    for index, message in enumerate(BATCH):
        planner.message(index, message)
    return planner.plan


# 8: a live batch, signed ahead of its reads; 0: a backlog, signed once its duplicates are known.
SIGNED = pytest.mark.parametrize("speculate_at_most", [8, 0], ids=["ahead", "backlog"])


@SIGNED
def test_profiles_off_keys_kuma_by_its_title_and_names_no_profile(speculate_at_most: int) -> None:
    plan = decide(Policy(profiles=False), speculate_at_most=speculate_at_most)
    assert [row.incident_key for row in plan.rows] == [
        "alerts:web down [uptime-kuma]",
        "alerts:web up [uptime-kuma]",
        "alerts:disk full",
    ]
    assert all("profile" not in record for record in plan.records)


@SIGNED
def test_profiles_auto_keys_kuma_as_one_incident_and_its_records_name_it(
    speculate_at_most: int,
) -> None:
    plan = decide(Policy(), speculate_at_most=speculate_at_most)
    keys = [row.incident_key for row in plan.rows]
    assert keys == ["uptime-kuma:alerts:web", "uptime-kuma:alerts:web", "alerts:disk full"]
    assert plan.incidents["uptime-kuma:alerts:web"].status == "resolved"
    assert [record.get("profile") for record in plan.records] == [
        "uptime-kuma",
        "uptime-kuma",
        None,
    ]


def test_a_record_naming_its_profile_folds_as_one_without_it() -> None:
    """The fold (a restart's replay of the audit log) reads no `profile`: the live state and the
    state replayed from the encoded lines agree."""
    plan = decide(Policy(), speculate_at_most=8)
    replayed = CadenceState.empty(Policy())
    for line in [audit.encode(record) for record in plan.records]:
        replayed.apply(json.loads(line))
    assert replayed.snapshot() == plan.state.snapshot()
