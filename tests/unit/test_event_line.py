"""The inbox writes each event's audit line field by field (it runs once per event): the text
must be exactly what `audit.encode` writes for the record `cadence_records.event_record` builds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ntfy_intake.rules import cadence, cadence_records, timestamps
from ntfy_intake.store import audit
from ntfy_intake.store.event_line import encode as _event_line
from ntfy_intake.wire.frames import Message

# Any text at all, lone surrogates and controls included: the incident key comes from a title.
# (st.text() leaves lone surrogates out even when its alphabet has them: lists do not.)
text = st.lists(
    st.one_of(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.characters()),
    max_size=30,
).map("".join)
ints = st.integers(min_value=-(2**70), max_value=2**70)


@settings(max_examples=500, deadline=None)
@given(
    event_id=text,
    topic=text,
    time=ints,
    expires=st.none() | ints,
    sequence_id=st.none() | text,
    sha256=text,
    key=text,
    severity=ints,
    status=st.sampled_from(["firing", "resolved"]),
    outcome=st.sampled_from(["triage_requested", "joined", "suppressed"]),
    reason=text,
    delivery_key=st.none() | text,
    now=st.floats(min_value=0, max_value=32_503_680_000),
)
def test_the_written_out_event_line_is_what_audit_encode_writes(
    event_id: str,
    topic: str,
    time: int,
    expires: int | None,
    sequence_id: str | None,
    sha256: str,
    key: str,
    severity: int,
    status: cadence.Status,
    outcome: cadence.Outcome,
    reason: str,
    delivery_key: str | None,
    now: float,
) -> None:
    message = Message(event_id, time, expires, topic, None, "", None, (), "{}", sha256, sequence_id)
    view = cadence.IncidentView(key, severity, status, False)
    decision = cadence.Decision(outcome, reason, delivery_key)
    record = cadence_records.event_record(
        decision,
        view,
        event_id,
        now,
        topic=topic,
        time=time,
        expires=expires,
        sequence_id=sequence_id,
        sha256=sha256,
    )
    assert _event_line(timestamps.rfc3339(now), message, view, decision) == audit.encode(record)
