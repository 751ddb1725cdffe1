"""The decode and the writer give byte-identical output whatever is done to make them faster.

A fixed set of lines (odd ones included: unicode, lone surrogates, base64 bodies, device
actions, updates, duplicates, a conflict, junk) goes through `decode_line`, `record_batch` in
several batches (the clock moving past the debounce and the cooldown) and `audit.flush`. What
comes out (each decoded frame, every row of every table, the audit file's bytes, each batch's
result and the cadence snapshot) must equal `writer_golden.json`, which was captured from the
code before the speed work of issue 16 (commit 3e56441). The stored raw frame and its hash are
part of it: they must never change.

Regenerate only for an intended change of output: uv run python -m tests.integration.test_writer_golden
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import random
import string
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.flow.pipeline import append_info_entry, append_triage_entry
from ntfy_intake.rules import cadence
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import audit, audit_mirror, db, inbox, migrations
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.wire import frames

from .. import harness

pytestmark = pytest.mark.engines

GOLDEN = Path(__file__).with_name("writer_golden.json")
TOPICS = frozenset({"alerts", "backups"})
T0 = 1_764_470_000
NOW = float(T0 + 30) + 0.123456
TABLES = (
    "inbox",
    "incidents",
    "outbox",
    "outbox_events",
    "quarantine",
    "audit_journal",
    "owner_outbox",
    "feed_entries",
    "kv",
)
# What both engines hold alike after a flush: all but the journal, which SQLite prunes and
# PostgreSQL keeps (held to the file instead).
ON_BOTH = tuple(table for table in TABLES if table != "audit_journal")


def _msg(event_id: str, t: int = T0, topic: str = "alerts", **fields: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"id": event_id, "time": t, "expires": t + 43200, "event": "message"}
    obj["topic"] = topic
    obj.update(fields)
    return obj


def _uncached(obj: dict[str, Any]) -> dict[str, Any]:
    del obj["expires"]  # published with `Cache: no`
    return obj


def _line(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )


def batches() -> list[list[bytes]]:
    """The lines, in the batches they are recorded in (each batch one `now`, see NOWS)."""
    envelope = json.dumps({"incident": "DB Primary", "severity": 5, "status": "firing"})
    resolved = json.dumps({"incident": "db primary", "severity": 2, "status": "resolved"})
    first = [
        _line({"event": "open", "topic": "alerts", "time": T0, "id": "openopenopen"}),
        _line(_msg("aaaaaaaaaaa1", title="Disk full", message="sda1 at 97%", priority=4)),
        _line(_msg("aaaaaaaaaaa2", title="  DISK   full ", message="sda1 at 98%")),
        _line(_msg("aaaaaaaaaaa3", message="nas1 down since 10:42, 3 retries, 12.5 GB left")),
        _line(_msg("aaaaaaaaaaa4", topic="backups", message="job 1234 failed after 15m")),
        _line(_msg("aaaaaaaaaaa5", title="Ünïcödé ☃ 🔥", message="tëxt \u2028 </script>")),
        b'{"id":"aaaaaaaaaaa6","time":1764470000,"event":"message","topic":"alerts",'
        b'"title":"lone \\ud83d surrogate","message":"pair \\ud83d\\ude00 and \\udc00"}',
        b'{"id":"aaaaaaaaaaa7","time":1764470000,"event":"message","topic":"alerts",'
        b'"message":"x","extra":{"k\\ud800":["\\udfff",1.5,1e400,-0.0,123456789012345678901234]}}',
        _line(_msg("aaaaaaaaaaa8", message=envelope, priority=1)),
        _line(
            _msg(
                "aaaaaaaaaaa9",
                encoding="base64",
                message=base64.b64encode("base64 body ✓".encode()).decode(),
            )
        ),
        _line(
            _msg("aaaaaaaaaa10", encoding="base64", message=base64.b64encode(b"\xff\xfe").decode())
        ),
        _line(_msg("aaaaaaaaaa11", encoding="base64", message="not base64!")),
        _line(
            _msg(
                "aaaaaaaaaa12",
                title="With extras",
                message="m",
                tags=["warning", "skull"],
                click="https://example.com/a?b=c&d=<e>",
                actions=[{"action": "view", "label": "Open", "url": "https://x"}],
                attachment={"name": "a.txt", "url": "https://x/a.txt", "size": 12},
                priority=5,
            )
        ),
        _line(_uncached(_msg("aaaaaaaaaa13", title="Disk full", message="sda1 at 99%"))),
        _line({**_msg("aaaaaaaaaa14", title="nocache", message="x"), "expires": None}),
        _line(_msg("aaaaaaaaaa1a", title="Disk full", message="again")),
        _line(_msg("aaaaaaaaaa1a", title="Disk full", message="again")),  # in-batch duplicate
        # A delete of a sequence not yet seen (linked later), then the message it names.
        _line(
            {
                "id": "dddddddddd01",
                "time": T0 + 1,
                "event": "message_delete",
                "topic": "alerts",
                "sequence_id": "seqaaaaaaa20",
            }
        ),
        _line(_msg("seqaaaaaaa20", title="Sequence head", message="v1")),
        _line(
            _msg(
                "aaaaaaaaaa21", t=T0 + 2, title="renamed", message="v2", sequence_id="seqaaaaaaa20"
            )
        ),
        _line({"id": "pppppppppp01", "time": T0, "event": "poll_request", "topic": "alerts"}),
        _line({"time": T0, "event": "poll_request", "topic": "alerts"}),
        _line({"event": "keepalive", "topic": "alerts", "time": T0}),
        b"not json at all",
        b"\xff\xfe not utf-8",
        b"[1, 2, 3]",
        b'{"id":"aaaaaaaaaa30","time":true,"event":"message","topic":"alerts"}',
        _line(_msg("aaaaaaaaaa31", priority=9)),
        _line(_msg("aaaaaaaaaa32", topic="other")),
        _line(_msg("aaaaaaaaaa33", tags="notalist")),
        _line(_msg("short")),
        _line({"id": "aaaaaaaaaa34", "event": "message"}),
        _line(_msg("aaaaaaaaaa35", title=7)),
        _line(_msg("aaaaaaaaaa36", sequence_id="bad sequence!")),
        _line(_msg("aaaaaaaaaa37", message=["not", "a", "string"])),
        _line(_msg("aaaaaaaaaa38", message="ctl \x1b[31mred\x07 \u202e")),
    ]
    second = [
        _line(_msg("aaaaaaaaaaa1", title="Disk full", message="sda1 at 97%", priority=4)),
        _line(_msg("aaaaaaaaaaa2", title="Disk full", message="a different body")),  # conflict
        _line(_msg("bbbbbbbbbbb1", t=T0 + 5, title="Disk full", message="sda1 at 99%", priority=5)),
        _line(_msg("bbbbbbbbbbb2", t=T0 + 5, message=resolved)),
        _line(
            {
                "id": "dddddddddd02",
                "time": T0 + 6,
                "event": "message_clear",
                "topic": "alerts",
                "sequence_id": "seqaaaaaaa20",
            }
        ),
        b"not json at all",
    ]
    third = [  # after the debounce: the first requests were released, new ones join nothing
        _line(_msg("ccccccccccc1", t=T0 + 40, title="Disk full", message="sda1 at 99%")),
        _line(_msg("ccccccccccc2", t=T0 + 40, message=envelope)),
        _line(
            {
                "id": "dddddddddd03",
                "time": T0 + 41,
                "event": "message_delete",
                "topic": "alerts",
                "sequence_id": "seqaaaaaaa20",
            }
        ),
    ]
    fourth = [  # after the cooldown: repeats open fresh requests
        _line(_msg(f"eeeeeeeeee{i:02d}", t=T0 + 4000 + i, title=f"incident {i % 3}", message="x"))
        for i in range(12)
    ]
    return [first, second, third, fourth]


NOWS = (NOW, NOW + 5.5, NOW + 40.25, NOW + 4000.0)


def backlog() -> list[list[bytes]]:
    """bench_writer.py's shape (many events of 50 incidents, two topics) in batches of 250, the
    clock 20 s on per batch: requests open, join, release, and the cooldown suppresses."""
    rng = random.Random(16)
    lines = []
    for i in range(2000):
        incident = rng.randrange(50)
        t = T0 + i // 25
        topic = "alerts" if i % 3 else "backups"
        text = f"event #{i}: disk {rng.randint(80, 99)}% on volume {incident}"
        fields: dict[str, Any] = {"title": f"incident {incident}", "message": text}
        if i % 7 == 0:
            fields = {"message": f"volume {incident} at {rng.randint(80, 99)}%"}
        fields["priority"] = rng.choice((2, 3, 3, 4, 5))
        event_id = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(12))
        lines.append(_line(_msg(event_id, t=t, topic=topic, **fields)))
    lines += lines[100:130]  # a replayed stretch: duplicates
    return [lines[start : start + 250] for start in range(0, len(lines), 250)]


def produce(
    directory: Path,
    parts: list[list[bytes]] | None = None,
    nows: tuple[float, ...] = NOWS,
    *,
    target: db.Target | None = None,
) -> dict[str, Any]:
    """What the writer makes of `parts`, in a store of its own on the test's engine (or in
    `target`)."""
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        store = target or stack.enter_context(harness.separate_store(directory))
        return _produce(directory, store, parts, nows)


def _table(conn: db.Connection, table: str) -> list[list[Any]]:
    """A table's rows in insertion order (SQLite's rowid); PostgreSQL has no such order, so
    there they come sorted and are compared sorted (`_sorted`)."""
    if db.is_postgres(conn):
        # Without the `rowid` identity column PostgreSQL's tables carry for the console's
        # paging (migrations_pg 0006): it stands in for SQLite's hidden rowid, not a value.
        cursor = conn.execute(f"SELECT * FROM {table}")
        names = [column.name for column in cursor.description]
        keep = [i for i, name in enumerate(names) if name != "rowid"]
        return _sorted([[row[i] for i in keep] for row in cursor])
    order = "rowid"
    if conn.execute(
        "SELECT 1 FROM sqlite_master WHERE name = ? AND sql LIKE '%WITHOUT ROWID%'", (table,)
    ).fetchone():
        # A WITHOUT ROWID table (outbox_events, migrations 0014) has no insertion order: its
        # primary key's.
        columns = conn.execute(f"PRAGMA table_info({table})").fetchall()
        order = ", ".join(c[1] for c in sorted(columns, key=lambda c: c[5]) if c[5])
    return [list(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY {order}")]


def _sorted(rows: list[list[Any]]) -> list[list[Any]]:
    return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True))


def _produce(
    directory: Path,
    target: db.Target,
    parts: list[list[bytes]] | None,
    nows: tuple[float, ...],
) -> dict[str, Any]:
    conn = db.connect(target)
    migrations.apply(conn)
    policy = cadence.Policy(debounce=10.0, cooldown=3600.0, daily_cap=3)
    queue = OwnerQueue(policy, cadence.CadenceState.empty(policy))
    log = audit.AuditLog(directory / "audit", clock=lambda: NOW)
    out: dict[str, Any] = {"frames": [], "batches": []}
    try:
        for lines, now in zip(parts or batches(), nows, strict=True):
            decoder = frames.NdjsonDecoder()
            decoded: list[Any] = []
            for line in decoder.feed(b"\n".join(lines) + b"\n"):
                frame = line if isinstance(line, frames.Junk) else frames.decode_line(line, TOPICS)
                out["frames"].append(repr(frame))
                if not isinstance(frame, frames.Open | frames.Keepalive):
                    decoded.append(frame)
            if now == NOWS[1]:
                decoded.append(Notice("gap", "a gap in the stream", "gap:1", {"topic": "alerts"}))
            result = inbox.record_batch(
                conn,
                decoded,
                now,
                queue=queue,
                relay_enabled=True,
                feed_append=append_triage_entry,
                note_append=append_info_entry,
            )
            audit.flush(conn, log)
            out["batches"].append(
                {
                    "candidates": [repr(c) for c in result.candidates],
                    "counts": [
                        result.recorded,
                        result.duplicates,
                        result.conflicts,
                        result.quarantined,
                    ],
                    "released": result.released,
                    "records": result.records,
                    "snapshot": queue.state.snapshot(),
                }
            )
        out["tables"] = {table: _table(conn, table) for table in TABLES}
        if db.is_postgres(conn):
            # PostgreSQL keeps the journal past the flush for the other nodes (audit.py): it
            # must be what the file holds, line for line, instead of empty as on SQLite.
            out["journal_mirrored"] = audit_mirror.matches(conn, directory / "audit")
    finally:
        log.close()
        conn.close()
    out["audit"] = {
        path.name: path.read_bytes().decode("ascii")
        for path in audit.log_files(directory / "audit")
    }
    return out


def _as_json(value: dict[str, Any]) -> str:
    return json.dumps(value, indent=1, ensure_ascii=True, sort_keys=True) + "\n"


def backlog_digest(directory: Path) -> str:
    """sha256 of everything a 2,030-event backlog produces (too long to keep as text)."""
    parts = backlog()
    nows = tuple(NOW + 20.0 * number for number in range(len(parts)))
    return hashlib.sha256(_as_json(produce(directory, parts, nows)).encode()).hexdigest()


def golden(directory: Path) -> dict[str, Any]:
    out = produce(directory / "odd")
    out["backlog_sha256"] = backlog_digest(directory / "backlog")
    return out


def test_decode_and_writer_output_is_byte_identical_to_the_captured_golden(
    tmp_path: Path,
) -> None:
    expected = json.loads(GOLDEN.read_text())
    if harness.DATABASE is None:
        produced = json.loads(_as_json(golden(tmp_path)))
        for part in ("frames", "batches", "tables", "audit", "backlog_sha256"):
            assert produced[part] == expected[part], part
        return
    # PostgreSQL: the same output, every table's rows compared as sorted (no rowid order).
    produced = json.loads(_as_json(produce(tmp_path / "odd")))
    for part in ("frames", "batches", "audit"):
        assert produced[part] == expected[part], part
    assert produced["journal_mirrored"]
    for table in ON_BOTH:
        assert produced["tables"][table] == _sorted(expected["tables"][table]), table
    # The backlog's golden is a digest of SQLite's rowid order: its output on PostgreSQL is
    # held to SQLite's, run here beside it, then SQLite's to the digest.
    parts = backlog()
    nows = tuple(NOW + 20.0 * number for number in range(len(parts)))
    on_pg = json.loads(_as_json(produce(tmp_path / "backlog", parts, nows)))
    reference = tmp_path / "backlog-sqlite"
    on_sqlite = produce(reference, parts, nows, target=reference / "intake.sqlite3")
    assert hashlib.sha256(_as_json(on_sqlite).encode()).hexdigest() == expected["backlog_sha256"]
    on_sqlite = json.loads(_as_json(on_sqlite))
    for part in ("frames", "batches", "audit"):
        assert on_pg[part] == on_sqlite[part], part
    assert on_pg["journal_mirrored"]
    for table in ON_BOTH:
        assert on_pg["tables"][table] == _sorted(on_sqlite["tables"][table]), table


def test_the_golden_set_exercises_every_odd_case(tmp_path: Path) -> None:
    """The golden is only as strong as the cases it holds: each kind of frame is in it."""
    produced = produce(tmp_path)
    kinds = " ".join(produced["frames"])
    for needle in ("Junk(", "DeviceAction(", "Ignored(", "Open(", "Keepalive(", "\ufffd"):
        assert needle in kinds, needle
    inbox_rows = produced["tables"]["inbox"]
    outcomes = {row[9] for row in inbox_rows}
    assert {"triage_requested", "joined", "noted", "ignored"} <= outcomes, outcomes
    assert any(count[1] and count[2] for count in (b["counts"] for b in produced["batches"]))
    assert produced["tables"]["feed_entries"], "no request was released"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(_as_json(golden(Path(tmp))))
    print(f"wrote {GOLDEN}")
