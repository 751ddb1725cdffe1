"""ntfy's device actions in storage: `message_delete` and `message_clear` (ntfy >= 2.16).

What they mean (outcome `noted`, linked to the incident of the message they name, never a
resolution) is decided in rules/batch_plan.py. Here: where a delete/clear's message request
stands (read with the batch's first reads), and the link of a delete/clear that came before its
message, made when that message is recorded (`link`, in the batch's write).
"""

from __future__ import annotations

from collections.abc import Sequence

from ntfy_intake.store import dialect
from ntfy_intake.store.transaction import Connection, Cursor

# Any delete/clear still waiting for its message? Read from the partial index `inbox_unlinked`
# (a few rows at most), named outright: left to the planner it picked `inbox_sequence` (every
# message ever recorded, once per batch: a long replay went quadratic) and, once the console's
# `inbox_incident` index came, that one, depending on SQLite's version and statistics.
# PostgreSQL has no INDEXED BY; its planner finds the partial index from the same WHERE.
UNLINKED_PROBE = (
    "SELECT 1 FROM inbox INDEXED BY inbox_unlinked"
    " WHERE incident_key = '' AND sequence_id IS NOT NULL LIMIT 1"
)
# SQLite: the probe (with the batch's reads), then one UPDATE per new sequence only when
# something waits.
_LINK = (
    "UPDATE inbox SET incident_key = ? WHERE topic = ? AND sequence_id = ?"
    " AND incident_key = '' AND event != 'message'"
)
# PostgreSQL: one statement for the batch, with no probe (a round trip): the join starts from
# the partial index inbox_unlinked (the few unlinked rows, `incident_key = ''`).
_LINK_PG = (
    "UPDATE inbox SET incident_key = u.key"
    " FROM unnest(CAST(? AS text[]), CAST(? AS text[]), CAST(? AS text[])) AS u(key, topic, seq)"
    " WHERE inbox.incident_key = '' AND inbox.topic = u.topic AND inbox.sequence_id = u.seq"
    " AND inbox.event != 'message'"
)
# The request of each message recorded under these sequences, with its state, oldest first
# (the latest is the one a delete/clear reaches).
_REQUESTS = (
    "SELECT n.topic, n.sequence_id, n.delivery_key, o.state FROM inbox n"
    " LEFT JOIN outbox o ON o.delivery_key = n.delivery_key"
    " WHERE {} AND n.event = 'message' ORDER BY n.seq"
)


def ask_requests(conn: Connection, sequences: list[str]) -> list[Cursor]:
    """Asked, not yet read: (topic, sequence id, delivery key, outbox state) of every message
    recorded under `sequences`, oldest first."""
    return [
        conn.execute(_REQUESTS.format(where), parameters)
        for where, parameters in dialect.one_of(conn, "n.sequence_id", sequences)
    ]


def ask_unlinked(conn: Connection) -> Cursor | None:
    """SQLite, with the batch's reads: any delete/clear waiting for its message (one row or
    none)? PostgreSQL asks nothing: its link is one statement whatever waits."""
    return None if dialect.is_postgres(conn) else conn.execute(UNLINKED_PROBE)


def link(conn: Connection, links: Sequence[tuple[str, str, str]]) -> None:
    """Deletes/clears that arrived before the message they name, linked to its incident now:
    `links` are (incident key, topic, sequence id) of the sequences a batch recorded first.
    The batch writes them only when one may wait (`ask_unlinked`, or one of its own)."""
    if not links:
        return
    if dialect.is_postgres(conn):
        conn.execute(_LINK_PG, [list(column) for column in zip(*links, strict=True)])
    else:
        conn.executemany(_LINK, links)
