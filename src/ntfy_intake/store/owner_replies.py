"""The owner's replies from the phone and their effects (flow/owner_replies.py): named SQL only.

- `owner_replies`: each received envelope once, by (source, envelope timestamp). `claim` inserts
  its row first in the effect's transaction: a replayed envelope finds the row and does nothing.
- `owner_signal_sent` (written by the owner sender): which of our messages a quote names, and
  the newest one about an incident; each with the incident's version when it went out
  (`shown_version`, read in the sender's settle transaction), the firing the message showed:
  a reply to it acknowledges that firing or nothing (flow/owner_replies.py).
- `owner_acks`: an incident the owner acknowledged, with the incident's `version` then (the
  version changes exactly when the severity rises or the status flips: rules/incidents.merge).
  An ack holds while the version is unchanged, or changed once by the incident resolving; it
  ends when the incident fires again (a second flip) or its severity rises. `ack_holds` drops
  one that ended, inside the caller's transaction, so an old ack never holds a new episode.
"""

from __future__ import annotations

from typing import Any

from ntfy_intake.rules import owner_replies as rules
from ntfy_intake.store import feed
from ntfy_intake.store.transaction import Connection

__all__ = [
    "ack",
    "ack_holds",
    "claim",
    "confirmations_since",
    "incident_of",
    "incident_state",
    "last_events",
    "message_for_signal_ts",
    "newest_incident_message",
    "queue_confirmation",
    "route_to_fallback",
    "settle",
    "shown_version",
]

# Owner messages about an incident: a triage reply to a request, or an escalation of one.
_INCIDENT_PREFIXES = ("notify:", "escalate:")

_CLAIM = (
    "INSERT INTO owner_replies(source, envelope_ts, received_at, command, result)"
    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (source, envelope_ts) DO NOTHING"
)
_TO_FALLBACK = "UPDATE owner_outbox SET channel = 'ntfy' WHERE key = ? AND state = 'pending'"
_CONFIRMATIONS_SINCE = "SELECT count(*) FROM owner_outbox WHERE topic = 'reply' AND kind = 'notice' AND created_at >= ?"
_SETTLE = "UPDATE owner_replies SET result = ? WHERE source = ? AND envelope_ts = ?"
_MESSAGE_FOR_TS = "SELECT key, incident_version FROM owner_signal_sent WHERE signal_ts = ?"
_NEWEST = (
    "SELECT key, sent_at, incident_version FROM owner_signal_sent"
    " WHERE sent_at >= ? AND (key LIKE 'notify:%' OR key LIKE 'escalate:%')"
    " ORDER BY sent_at DESC, signal_ts DESC LIMIT 1"
)
_INCIDENT_OF = "SELECT incident_key FROM outbox WHERE delivery_key = ?"
_INCIDENT_STATE = "SELECT severity, status, version FROM incidents WHERE key = ?"
_ACK = (
    "INSERT INTO owner_acks(incident_key, version, acked_at) VALUES (?, ?, ?)"
    " ON CONFLICT (incident_key) DO UPDATE SET version = excluded.version,"
    " acked_at = excluded.acked_at"
)
_ACK_ROW = "SELECT version FROM owner_acks WHERE incident_key = ?"
_ACK_DROP = "DELETE FROM owner_acks WHERE incident_key = ?"
_LAST_EVENTS = (
    "SELECT time, severity, raw FROM inbox WHERE incident_key = ? ORDER BY time DESC LIMIT ?"
)
_CONFIRM = (
    "INSERT INTO owner_outbox(key, kind, topic, text, state, due_at, created_at)"
    " VALUES (?, 'notice', 'reply', ?, 'pending', ?, ?) ON CONFLICT (key) DO NOTHING"
)


def claim(conn: Connection, source: str, ts: int, now: float, command: str, result: str) -> bool:
    """Record the envelope (source, ts) in the caller's write transaction; False when it was
    recorded before (a replay: its effect happened then, nothing happens now)."""
    return conn.execute(_CLAIM, (source, ts, now, command, result)).rowcount == 1


def settle(conn: Connection, source: str, ts: int, result: str) -> None:
    """The claimed envelope's result, in the same transaction as its claim."""
    conn.execute(_SETTLE, (result, source, ts))


def message_for_signal_ts(conn: Connection, signal_ts: int) -> tuple[str, int | None] | None:
    """The owner message Signal answered `signal_ts` for: (key, the incident's version when it
    went out, None when not known)."""
    row = conn.execute(_MESSAGE_FOR_TS, (signal_ts,)).fetchone()
    return None if row is None else (str(row[0]), _int_or_none(row[1]))


def newest_incident_message(conn: Connection, since: float) -> tuple[str, float, int | None] | None:
    """Our newest message about an incident sent at or after `since`: (key, sent_at, the
    incident's version when it went out)."""
    row = conn.execute(_NEWEST, (since,)).fetchone()
    return None if row is None else (str(row[0]), float(row[1]), _int_or_none(row[2]))


def shown_version(conn: Connection, key: str) -> int | None:
    """The version of the incident the owner message `key` is about, as it stands (read when
    the message goes out: the firing it shows); None for a message about no incident."""
    incident = incident_of(conn, key)
    state = None if incident is None else incident_state(conn, incident)
    return None if state is None else state[2]


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def incident_of(conn: Connection, key: str) -> str | None:
    """The incident an owner message is about (None for a notice or an agent's own notify)."""
    for prefix in _INCIDENT_PREFIXES:
        if key.startswith(prefix):
            row = conn.execute(_INCIDENT_OF, (key[len(prefix) :],)).fetchone()
            return None if row is None else str(row[0])
    return None


def incident_state(conn: Connection, incident: str) -> tuple[int, str, int] | None:
    """(severity, status, version) of an incident as recorded."""
    row = conn.execute(_INCIDENT_STATE, (incident,)).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), int(row[2]))


def ack(
    conn: Connection,
    incident: str,
    version: int,
    now: float,
    *,
    about: str | None = None,
    via: str = "signal",
) -> None:
    """Record the owner's ack and its `incident_info` feed entry (the agent hears of it), in the
    caller's write transaction; `about` is the owner message the ack answered."""
    conn.execute(_ACK, (incident, version, now))
    feed.append_owner_ack(conn, incident, version, now, about=about, via=via)


def ack_holds(conn: Connection, incident: str) -> bool:
    """Whether the owner's ack still holds owner messages about `incident`, inside the caller's
    write transaction; an ack that ended (fired again, or severity rose) is dropped here."""
    row = conn.execute(_ACK_ROW, (incident,)).fetchone()
    if row is None:
        return False
    state = incident_state(conn, incident)
    if state is None:
        return True
    _severity, status, version = state
    if rules.ack_current(int(row[0]), status, version):
        return True
    conn.execute(_ACK_DROP, (incident,))
    return False


def last_events(conn: Connection, incident: str, limit: int) -> list[tuple[int, int, str]]:
    """The incident's newest events: (time, severity, raw JSON), newest first."""
    rows = conn.execute(_LAST_EVENTS, (incident, limit)).fetchall()
    return [(int(r[0]), int(r[1]), str(r[2])) for r in rows]


def queue_confirmation(conn: Connection, key: str, text: str, now: float) -> None:
    """Queue a confirmation to the owner, outside the cadence (no daily cap, no audit fold)."""
    conn.execute(_CONFIRM, (key, text, now, now))


def route_to_fallback(conn: Connection, key: str) -> None:
    """Send a queued owner message through the fallback topic, not Signal (the reply path's
    notice: Signal is what fails), in the caller's write transaction."""
    conn.execute(_TO_FALLBACK, (key,))


def confirmations_since(conn: Connection, since: float) -> int:
    """Confirmations and help texts queued at or after `since` (their own rate limit)."""
    return int(conn.execute(_CONFIRMATIONS_SINCE, (since,)).fetchone()[0])
