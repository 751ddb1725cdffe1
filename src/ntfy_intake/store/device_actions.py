"""ntfy's device actions in the inbox transaction: `message_delete` and `message_clear` (ntfy >=
2.16), and events of a kind ntfy-intake does not know.

A delete/clear gets its own inbox row and outcome `noted`, linked to the incident of the message
it names (one that arrives first stays unlinked until that message is recorded: `Batch.write`
links it). An unknown kind gets outcome `ignored`. Neither decides anything: no incident change,
no triage request. A delete/clear of a message whose triage request already went out reaches the
agent as information, on its own feed channel.
"""

from __future__ import annotations

from ntfy_intake.rules import timestamps
from ntfy_intake.store import audit
from ntfy_intake.store.inbox_batch import Batch, Candidate
from ntfy_intake.wire.frames import DeviceAction, Ignored

DEVICE_ACTION_SCHEMA = "ntfy-intake.device-action/1"
DEVICE_ACTION_WORDS = {
    "message_delete": "removed from devices",
    "message_clear": "read and dismissed on a device",
}


def record(batch: Batch, index: int, event: DeviceAction | Ignored) -> None:
    """A delete/clear (outcome `noted`, linked to its message's incident) or an unknown kind
    (outcome `ignored`). Neither decides anything: no incident change, no triage request."""
    if batch.seen(index, event):
        return
    sequence: str | None
    if isinstance(event, DeviceAction):
        sequence = event.sequence_id
        incident = batch.sequences.get((event.topic, sequence), "")
        outcome = "noted"
        reason = f"{event.kind}: message {sequence} {DEVICE_ACTION_WORDS[event.kind]}"
    else:
        sequence, incident, outcome = None, "", "ignored"
        reason = f"unknown event kind {event.kind!r}"
    batch.inbox_rows.append(
        (
            event.id,
            event.topic,
            event.time or 0,
            event.expires,
            event.raw,
            event.raw_sha256,
            incident,
            0,
            outcome,
            reason,
            None,
            batch.now,
            event.kind,
            sequence,
        )
    )
    record = {
        "ts": timestamps.rfc3339(batch.now),
        "kind": "event",
        "event_id": event.id,
        "event": event.kind,
        "incident": incident or None,
        "sequence_id": sequence,
        "outcome": outcome,
        "reason": reason,
        "topic": event.topic or None,
        "time": event.time,
        "expires": event.expires,
    }
    batch.journal.append(audit.encode(record))
    batch.result.records.append({k: v for k, v in record.items() if v is not None})
    batch.result.recorded += 1
    if isinstance(event, DeviceAction) and incident:
        _note_late(batch, event, incident)
    if event.time is not None:
        batch.result.candidates.append(Candidate(index, event.id, event.time, event.cached))


def _note_late(batch: Batch, event: DeviceAction, incident: str) -> None:
    """A delete/clear of a message whose triage request already went out (or that joined
    none): the agent hears of it as information, on its own feed channel. One still
    collecting lists it in its payload instead (outbox.build_payload)."""
    if batch.note_append is None:
        return
    row = batch.conn.execute(
        "SELECT n.delivery_key, o.state FROM inbox n"
        " LEFT JOIN outbox o ON o.delivery_key = n.delivery_key"
        " WHERE n.topic = ? AND n.sequence_id = ? AND n.event = 'message'"
        " ORDER BY n.seq DESC LIMIT 1",
        (event.topic, event.sequence_id),
    ).fetchone()
    if row is None or row[1] == "collecting":
        return
    payload: dict[str, object] = {
        "schema": DEVICE_ACTION_SCHEMA,
        "incident": incident,
        "event": event.kind,
        "id": event.id,
        "sequence_id": event.sequence_id,
        "topic": event.topic,
        "time": event.time,
        "delivery_key": row[0],
    }
    summary = f"{incident}: {event.kind} of {event.sequence_id}"
    batch.note_append(batch.conn, event.id, payload, summary, batch.now)
