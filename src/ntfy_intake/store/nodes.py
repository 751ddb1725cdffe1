"""The per-node readiness rows on PostgreSQL (DESIGN.md section 11): their SQL, and only here.

One row per node name (`nodes`, migration 0008): the instance that last reported under it, its
readiness verdict and reason, its work fingerprint (whole, and per key as JSON), its version,
whether its code knows every migration in the ledger, what its work is (`intake`: live, dead,
latched or standby) since when, and `seen_at`. Every time is the server's `now()`; ages are
computed on the server, so two boxes whose clocks disagree read the same ages.

Invariants owned here:
- `report` writes a node's row only when the row is absent, already this instance's, a crashed
  predecessor's of the same state directory (`predecessor`, the directory prefix: this process
  holds the directory's lock, so no live process carries it), or stale (not seen for `stale_s`
  seconds). Otherwise it writes nothing and answers the other instance's row: a second live
  process under an existing name never overwrites the first's row (runtime/readiness decides);
- `owe` adds a notice to this instance's row only (`owed`, a JSON object by notice key: the
  same notice owed twice is one), and `settle` removes only the keys the leader recorded, so a
  notice owed between the leader's read and its settle stays owed;
- nothing here takes a lock another statement waits for beyond its own row: a node's report
  never queues behind the leader's writes (it runs on a connection of its own, never the
  lease's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ntfy_intake.rules.readiness import NodeSeen
from ntfy_intake.store import postgres
from ntfy_intake.store.transaction import Connection

_AGES = """node, instance, ready, reason, fingerprint, parts, version, schema_known, intake,
    EXTRACT(EPOCH FROM now() - seen_at)::float8 AS seen_age_s,
    EXTRACT(EPOCH FROM now() - intake_since)::float8 AS intake_age_s,
    EXTRACT(EPOCH FROM seen_at)::float8 AS seen_at"""
_READ_ALL = f"SELECT {_AGES} FROM nodes ORDER BY node"
_REPORT = f"""INSERT INTO nodes AS n(node, instance, ready, reason, fingerprint, parts, version,
        schema_known, intake, intake_since, seen_at)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?,
        CASE WHEN ?::float8 IS NULL THEN NULL
             ELSE now() - ?::float8 * INTERVAL '1 second' END,
        now())
    ON CONFLICT (node) DO UPDATE SET instance = excluded.instance, ready = excluded.ready,
        reason = excluded.reason, fingerprint = excluded.fingerprint, parts = excluded.parts,
        version = excluded.version, schema_known = excluded.schema_known,
        intake = excluded.intake, intake_since = excluded.intake_since, seen_at = now()
    WHERE n.instance = excluded.instance
       OR (? <> '' AND starts_with(n.instance, ?))
       OR n.seen_at < now() - ?::float8 * INTERVAL '1 second'
    RETURNING {_AGES}"""
_READ_ONE = f"SELECT {_AGES} FROM nodes WHERE node = ?"
_FORGET = "DELETE FROM nodes WHERE node = ? AND instance = ?"
# Only this instance's row: a leaving node never marks another live process's.
_LEAVING = """UPDATE nodes SET ready = false, reason = ?, intake = 'standby', intake_since = now(),
        seen_at = now()
    WHERE node = ? AND instance = ?"""


def report(
    conn: Connection,
    *,
    node: str,
    instance: str,
    ready: bool,
    reason: str | None,
    fingerprint: str,
    parts: Mapping[str, str],
    version: str,
    schema_known: bool,
    intake: str,
    intake_age_s: float | None,
    predecessor: str = "",
    stale_s: float,
) -> tuple[bool, NodeSeen]:
    """Upsert this node's row (module doc), seen_at = the server's now(); `intake_age_s` (how
    long this intake state has held, a duration on the node's monotonic clock) becomes
    `intake_since = now() - age` on the server. Answers (written, the row as it is now): when
    not written, the row is another live instance's under this name."""
    pg = _pg(conn)
    age = None if intake_age_s is None else max(0.0, float(intake_age_s))
    row = pg.execute(
        _REPORT,
        (
            node,
            instance,
            ready,
            reason,
            fingerprint,
            json.dumps(dict(parts), sort_keys=True),
            version,
            schema_known,
            intake,
            age,
            age,
            predecessor,
            predecessor,
            float(stale_s),
        ),
    ).fetchone()
    if row is not None:
        return True, _seen(row)
    other = pg.execute(_READ_ONE, (node,)).fetchone()
    if other is None:  # deleted between the two statements: the next report writes it
        return False, _absent(node)
    return False, _seen(other)


def read_all(conn: Connection) -> list[NodeSeen]:
    """Every node's row, by name, with ages on the server's clock."""
    return [_seen(row) for row in _pg(conn).execute(_READ_ALL).fetchall()]


def forget(conn: Connection, node: str, instance: str) -> bool:
    """Remove this instance's row (a node taken out of the cluster for good: `status` stops
    listing it). Another instance's row under the name is left alone."""
    return int(_pg(conn).execute(_FORGET, (node, instance)).rowcount) > 0


def leaving(conn: Connection, *, node: str, instance: str, reason: str) -> bool:
    """This instance's row says not ready, `reason`, now: a node about to release the lease (a
    graceful stop, a yield) is no ready peer for anyone from here on (runtime/readiness,
    `Prober.leaving`). False when the row is not this instance's (nothing written)."""
    return int(_pg(conn).execute(_LEAVING, (reason, node, instance)).rowcount) > 0


_OWE = """UPDATE nodes SET owed = (owed::jsonb || jsonb_build_object(?::text, ?::jsonb))::text
    WHERE node = ? AND instance = ?"""
_READ_OWED = "SELECT node, owed FROM nodes WHERE owed <> '{}' ORDER BY node"
_SETTLE = "UPDATE nodes SET owed = (owed::jsonb - ?::text[])::text WHERE node = ?"


def owe(conn: Connection, *, node: str, instance: str, key: str, notice: Mapping[str, Any]) -> bool:
    """This instance owes the owner `notice` (a JSON object), by `key`: written on its own row
    for the leader to record (a standby cannot write the outbox). False when the row is not
    this instance's (nothing written)."""
    args = (key, json.dumps(dict(notice), sort_keys=True), node, instance)
    return int(_pg(conn).execute(_OWE, args).rowcount) > 0


def owed(conn: Connection) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """Every node's owed notices: (node, {key: notice}), the nodes owing something only."""
    found = []
    for row in _pg(conn).execute(_READ_OWED).fetchall():
        try:
            notices = json.loads(row["owed"])
        except (TypeError, ValueError):
            continue
        if isinstance(notices, dict):
            found.append(
                (str(row["node"]), {str(k): v for k, v in notices.items() if isinstance(v, dict)})
            )
    return found


def settle(conn: Connection, node: str, keys: list[str]) -> None:
    """The leader recorded `keys` of `node`'s owed notices: they are owed no more."""
    _pg(conn).execute(_SETTLE, (keys, node))


def _seen(row: Any) -> NodeSeen:
    try:
        parts = json.loads(row["parts"])
    except (TypeError, ValueError):
        parts = {}
    intake_age = row["intake_age_s"]
    return NodeSeen(
        node=str(row["node"]),
        instance=str(row["instance"]),
        ready=bool(row["ready"]),
        reason=None if row["reason"] is None else str(row["reason"]),
        fingerprint=str(row["fingerprint"]),
        parts={str(k): str(v) for k, v in parts.items()} if isinstance(parts, dict) else {},
        version=str(row["version"]),
        schema_known=bool(row["schema_known"]),
        seen_age_s=max(0.0, float(row["seen_age_s"])),
        intake=str(row["intake"]),
        intake_age_s=None if intake_age is None else max(0.0, float(intake_age)),
        seen_at=float(row["seen_at"]),
    )


def _absent(node: str) -> NodeSeen:
    return NodeSeen(node, "", False, "absent", "", {}, "", False, float("inf"), "standby", None)


def _pg(conn: Connection) -> postgres.PgConnection:
    if not isinstance(conn, postgres.PgConnection):
        raise TypeError("node rows need the PostgreSQL engine ([state] database)")
    return conn
