"""The daemon's tables, as an ordered list of named migrations (see db.migrate).

Invariants live in the schema: one inbox row per ntfy id (PRIMARY KEY), outbox states are a
closed set (CHECK), a quarantined frame is stored once however often it is replayed (UNIQUE hash).
"""

from __future__ import annotations

from ntfy_intake.store.db import Migration

CORE: list[Migration] = [
    (
        "001_core",
        [
            """CREATE TABLE inbox(
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                event_id TEXT NOT NULL UNIQUE,
                topic TEXT NOT NULL,
                time INTEGER NOT NULL,
                expires INTEGER,
                raw TEXT NOT NULL,
                raw_sha256 TEXT NOT NULL,
                incident_key TEXT NOT NULL,
                severity INTEGER NOT NULL,
                outcome TEXT NOT NULL,
                reason TEXT NOT NULL,
                delivery_key TEXT,
                received_at REAL NOT NULL)""",
            "CREATE INDEX inbox_received ON inbox(received_at)",
            """CREATE TABLE incidents(
                key TEXT PRIMARY KEY,
                severity INTEGER NOT NULL,
                status TEXT NOT NULL CHECK (status IN ('firing', 'resolved')),
                status_time INTEGER NOT NULL,
                status_event TEXT NOT NULL,
                first_seen INTEGER NOT NULL,
                last_seen INTEGER NOT NULL,
                events INTEGER NOT NULL,
                version INTEGER NOT NULL)""",
            """CREATE TABLE outbox(
                delivery_key TEXT PRIMARY KEY,
                incident_key TEXT NOT NULL,
                reason TEXT NOT NULL,
                state TEXT NOT NULL CHECK (
                    state IN ('collecting', 'pending', 'leased', 'delivered', 'dead', 'skipped')),
                payload TEXT,
                incident_version INTEGER,
                attempts INTEGER NOT NULL DEFAULT 0,
                due_at REAL NOT NULL,
                lease_until REAL,
                last_error TEXT,
                response TEXT,
                created_at REAL NOT NULL,
                settled_at REAL)""",
            "CREATE INDEX outbox_due ON outbox(state, due_at)",
            "CREATE INDEX outbox_incident ON outbox(incident_key, state)",
            """CREATE TABLE outbox_events(
                delivery_key TEXT NOT NULL REFERENCES outbox(delivery_key),
                event_id TEXT NOT NULL,
                PRIMARY KEY(delivery_key, event_id))""",
            """CREATE TABLE quarantine(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                raw_sha256 TEXT NOT NULL UNIQUE,
                raw TEXT NOT NULL,
                reason TEXT NOT NULL,
                event_id TEXT,
                first_seen REAL NOT NULL,
                last_seen REAL NOT NULL,
                count INTEGER NOT NULL)""",
            """CREATE TABLE owner_outbox(
                key TEXT PRIMARY KEY,
                kind TEXT NOT NULL CHECK (kind IN ('notice', 'triage')),
                topic TEXT NOT NULL,
                text TEXT NOT NULL,
                state TEXT NOT NULL
                    CHECK (state IN ('pending', 'leased', 'sent', 'suppressed', 'dead')),
                attempts INTEGER NOT NULL DEFAULT 0,
                due_at REAL NOT NULL,
                lease_until REAL,
                channel TEXT,
                last_error TEXT,
                created_at REAL NOT NULL,
                settled_at REAL)""",
            "CREATE INDEX owner_outbox_due ON owner_outbox(state, due_at)",
            """CREATE TABLE audit_journal(
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                line TEXT NOT NULL)""",
            """CREATE TABLE cursor(
                id INTEGER PRIMARY KEY CHECK (id = 1),
                kind TEXT NOT NULL CHECK (kind IN ('id', 'time', 'all')),
                value TEXT NOT NULL,
                message_time INTEGER,
                updated_at REAL NOT NULL)""",
            """CREATE TABLE kv(
                name TEXT PRIMARY KEY,
                value TEXT NOT NULL)""",
        ],
    ),
    # Issue 11: ntfy >= 2.16 events (an inbox row knows its event kind and the message sequence it
    # belongs to or names), the durable overlap backfill owed, and the server time of the last frame
    # seen (the start of a gap window). Another branch may append its own migration after this one.
    (
        "002_sequences_backfill",
        [
            "ALTER TABLE inbox ADD COLUMN event TEXT NOT NULL DEFAULT 'message'",
            "ALTER TABLE inbox ADD COLUMN sequence_id TEXT",
            "CREATE INDEX inbox_sequence ON inbox(sequence_id, topic)",
            # Delete/clear events whose message has not arrived yet: linked when it does.
            "CREATE INDEX inbox_unlinked ON inbox(topic, sequence_id) WHERE incident_key = ''",
            "ALTER TABLE cursor ADD COLUMN backfill_from INTEGER",
            "ALTER TABLE cursor ADD COLUMN backfill_epoch INTEGER NOT NULL DEFAULT 0",
            "ALTER TABLE cursor ADD COLUMN last_frame_time INTEGER",
            "ALTER TABLE cursor ADD COLUMN gap_from INTEGER",
        ],
    ),
]
