"""A delete/clear that reaches agents on the `incident_info` channel says so on its audit line
(`info_for`: the request it reached), so a rebuild from the audit log restores the entry
(store/rebuild.py): which request the planner found, and whether it still collected, were read
from a database a rebuild no longer has. Pure planner, time injected.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import json

import pytest

from ntfy_intake.rules.batch_plan import Answers, Note
from ntfy_intake.store import audit

from .test_batch_plan import action, decide


@pytest.mark.parametrize(
    ("request_key", "state", "line_says"),
    [
        ("tri_seqaaaaaaa01", "collecting", None),  # listed in its own payload: no entry
        ("tri_seqaaaaaaa01", "pending", "tri_seqaaaaaaa01"),
        ("tri_seqaaaaaaa01", "delivered", "tri_seqaaaaaaa01"),
        (None, None, ""),  # its message joined no request: the entry names none
    ],
)
def test_late_delete_line_names_the_request_its_feed_entry_names(
    request_key: str | None, state: str | None, line_says: str | None
) -> None:
    """Failure mode: the line of a delete/clear that became an `incident_info` entry reads
    like any other delete/clear's, so a rebuild cannot tell which of them reached agents, nor
    the request the entry named, and the channel comes back empty."""
    answers = Answers(
        sequences={("alerts", "seqaaaaaaa01"): "alerts:disk full"},
        requests={("alerts", "seqaaaaaaa01"): (request_key, state)},
    )
    plan = decide([action("dddddddddd01", "message_delete", "seqaaaaaaa01")], answers=answers)
    notes = [a.item for a in plan.asides if isinstance(a.item, Note)]
    line = json.loads(audit.encode(plan.records[0]))  # as the journal stores it
    assert line.get("info_for") == line_says
    expected = [] if line_says is None else [request_key]
    assert [n.payload["delivery_key"] for n in notes] == expected
