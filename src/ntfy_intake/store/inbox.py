"""The inbox transaction: every frame of a batch is recorded in ONE `BEGIN IMMEDIATE` transaction.

Per message: inbox row (PK = ntfy id; identical body = duplicate, different body = conflict,
which goes to the quarantine), incident merge, cadence decision, outbox row, feed entry on release,
and the audit journal record. Junk frames go to the quarantine with their reason (stored once per
distinct raw line however often ntfy replays it). Any exception rolls every table back.

ntfy >= 2.16 sequences: a message whose sequence (its `sequence_id`, else its id) is already known
joins that sequence's incident whatever its title (an update). `message_delete`/`message_clear`
get their own row and outcome `noted`, linked to the incident of the message they name; one that
arrives first stays unlinked (incident_key '') until that message is recorded. Neither touches the
incident's status nor any triage request. Unknown event kinds: outcome `ignored`, with the kind.

The transaction goes in three steps: store reads what the batch needs (`inbox_batch.read`),
the pure planner decides every row, request and record (rules/batch_plan.py), store writes the
plan (`inbox_batch.write`), then the release of the windows that closed (`outbox.release_due`).

Cadence decisions are made on a fork of the live cadence state, which the owner queue adopts
only after COMMIT (`OwnerQueue.fork_for`, the one rule of `db.Transaction`), so a rollback
changes nothing and a batch run again decides as the first run did.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace

import structlog

from ntfy_intake.rules import batch_plan
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import db, inbox_batch, outbox, quarantine
from ntfy_intake.store.inbox_batch import BatchResult, Candidate, NoteAppend
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.store.transaction import Connection
from ntfy_intake.wire.frames import DeviceAction, Event, Ignored, Junk, Message

log = structlog.get_logger("ntfy_intake.inbox")

# Runs inside the batch's transaction after its rows are written (the backfill's own record).
InTransaction = Callable[[Connection, "BatchResult"], None]


def record_batch(
    conn: Connection,
    frames: Sequence[Event | Junk | Notice],
    now: float,
    *,
    queue: OwnerQueue,
    relay_enabled: bool,
    feed_append: outbox.FeedAppend | None = None,
    before_commit: db.BeforeCommit | None = None,
    also: InTransaction | None = None,
    note_append: NoteAppend | None = None,
    hand_off: outbox.HandOff | None = None,
) -> BatchResult:
    """Record a batch in one transaction. When a value in it breaks processing (the transaction
    rolled back, nothing recorded), the frames are recorded one transaction each instead, and
    the frame that still fails alone gets outcome `quarantined` with the error: no value read
    from ntfy can stop intake. Storage failures are not blamed on a value and propagate.
    `also` runs once, in the batch's transaction, or after the last frame's when one by one.
    `hand_off`: room the caller's relay has for released rows (outbox.ask_hand_off); the batch
    only, never the one-by-one re-run (`BatchResult.handed`)."""
    record = functools.partial(
        _record_batch,
        conn,
        now=now,
        queue=queue,
        relay_enabled=relay_enabled,
        feed_append=feed_append,
        before_commit=before_commit,
        note_append=note_append,
    )
    try:
        return record(frames, also=also, hand_off=hand_off)
    except Exception as exc:
        if not quarantine.blames_the_value(exc):
            raise
        log.warning("inbox.batch_failed_one_by_one", frames=len(frames), error=repr(exc))
    total = _one_by_one(conn, frames, now, queue, record)  # no hand-off: a fault's slow path
    if also is not None:
        with db.write_txn(conn, before_commit=before_commit):
            also(conn, total)
    return total


def _record_batch(
    conn: Connection,
    frames: Sequence[Event | Junk | Notice],
    *,
    now: float,
    queue: OwnerQueue,
    relay_enabled: bool,
    feed_append: outbox.FeedAppend | None = None,
    before_commit: db.BeforeCommit | None = None,
    also: InTransaction | None = None,
    note_append: NoteAppend | None = None,
    hand_off: outbox.HandOff | None = None,
) -> BatchResult:
    with db.write_txn(conn, before_commit=before_commit) as txn:
        # Read what the batch needs, decide it (pure: rules/batch_plan.py), write the plan.
        planner = batch_plan.Planner(queue.policy, now)
        answers = inbox_batch.read(conn, planner, frames, notes=note_append is not None)
        plan = inbox_batch.decide(planner, answers, queue.fork_for(txn), frames)
        result = inbox_batch.write(txn, plan, answers, now, queue=queue, note_append=note_append)
        if also is not None:
            also(conn, result)
        result.released = outbox.release_due(
            conn, now, relay_enabled=relay_enabled, feed_append=feed_append
        )
        handed = outbox.ask_hand_off(conn, result.released, now, hand_off)
        # Answered with the COMMIT's answer on PostgreSQL: no wait of its own after it.
        next_release = outbox.ask_next_release(conn) if result.recorded else None
    result.state = plan.state
    result.handed = handed()
    if next_release is not None:
        result.next_release = next_release()
        result.release_known = True
    return result


def _one_by_one(
    conn: Connection,
    frames: Sequence[Event | Junk | Notice],
    now: float,
    queue: OwnerQueue,
    record: Callable[[Sequence[Event | Junk | Notice]], BatchResult],
) -> BatchResult:
    total = BatchResult(state=queue.state)
    for index, frame in enumerate(frames):
        try:
            # Each frame commits on its own and the queue adopts its decisions then, so a storage
            # fault on a later frame (the whole trip runs again) decides from what is durable.
            result = record([frame])
        except Exception as exc:
            if not quarantine.blames_the_value(exc):
                raise
            _quarantine_failed(conn, frame, exc, now, total, index)
            continue
        total.state = queue.state
        total.candidates.extend(replace(c, index=index) for c in result.candidates)
        total.recorded += result.recorded
        total.duplicates += result.duplicates
        total.conflicts += result.conflicts
        total.quarantined += result.quarantined
        total.released.extend(result.released)
        total.records.extend(result.records)
    return total


def _quarantine_failed(
    conn: Connection,
    frame: Event | Junk | Notice,
    exc: Exception,
    now: float,
    total: BatchResult,
    index: int,
) -> None:
    """The frame failed on its own: record that, in its own small transaction."""
    error = quarantine.describe(exc)
    log.error("inbox.event_quarantined", error=error, event_id=getattr(frame, "id", None))
    try:
        with db.write_txn(conn):
            if isinstance(frame, Message | DeviceAction | Ignored):
                quarantine.record_failed_event(conn, frame, error, now)
            elif isinstance(frame, Junk):
                quarantine.record_failed_junk(conn, frame, error, now)
            else:
                return  # a notice is ours, not read from anyone: logged above, never retried
    except Exception as again:
        if not quarantine.blames_the_value(again):
            raise
        log.error("inbox.quarantine_failed", error=quarantine.describe(again))
        return
    total.quarantined += 1
    if isinstance(frame, Message | DeviceAction):
        total.candidates.append(Candidate(index, frame.id, frame.time, frame.cached))
