"""CPU per replayed event of the decode and the writer, in-process (no daemon, no HTTP).

The same backlog as bench_replay.py (50 incidents, two topics), as ntfy's NDJSON bytes, through
the daemon's own per-event code, each part next to a plain reference in the same run:

- decode: `NdjsonDecoder.feed` (one chunk per frame, as ntfy writes) + `decode_line`;
  reference: a bare `json.loads` of each line;
- record: `inbox.record_batch` in batches of 500 (`--batch`) on a fresh database (as pipeline.py
  calls it),
  then `audit.flush` of the batch (lines, fsync, mark); reference: one `executemany` of the same
  inbox rows per transaction, into a table of the same columns;
- encode: `audit.encode` of every event record the replay wrote (the general encoder of every
  record, the inbox's event lines among them); reference: a bare `json.dumps`.

CPU is `time.thread_time()` of this thread (SQLite runs in it), the best of `--repeat` runs, in
microseconds per event. `--profile` prints cProfile's top functions of one decode + record run.

Run alone: uv run python bench/bench_writer.py [--events 10000] [--repeat 3] [--batch 500]
[--profile]; `rows(measure(...))` gives the table rows for run_all.py.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import pstats
import random
import string
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import Row, ratio
from ntfy_intake.flow.pipeline import append_info_entry, append_triage_entry
from ntfy_intake.rules import cadence
from ntfy_intake.store import audit, db, inbox, migrations
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.testbed.emulator.wire import MESSAGE, Event
from ntfy_intake.wire import frames

INCIDENTS = 50
BATCH = 500  # pipeline.MAX_BATCH; a replay that keeps up gets smaller ones (--batch)
TOPICS = frozenset({"alerts", "backups"})
START = 1_764_470_000  # the backlog's first `time`
ID_ALPHABET = string.ascii_letters + string.digits


def backlog_lines(n: int, seed: int = 1) -> list[bytes]:
    """bench_replay's backlog as the lines ntfy writes (Go's JSON, one per message)."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        incident = rng.randrange(INCIDENTS)
        event_time = START + i // 50
        event = Event(
            id="".join(rng.choice(ID_ALPHABET) for _ in range(12)),
            time=event_time,
            event=MESSAGE,
            topic="alerts" if i % 3 else "backups",
            expires=event_time + 43200,
            title=f"incident {incident}",
            message=f"backlog event #{i}: disk usage {rng.randint(80, 99)}% on volume {incident}",
            priority=rng.choice((2, 3, 3, 4, 5)),
        )
        lines.append(event.line())
    return lines


def cpu(fn: Callable[[], object]) -> float:
    began = time.thread_time()
    fn()
    return time.thread_time() - began


def decode_all(chunks: list[bytes]) -> list[frames.Frame]:
    decoder = frames.NdjsonDecoder()
    out: list[frames.Frame] = []
    for chunk in chunks:
        for line in decoder.feed(chunk):
            out.append(line if isinstance(line, frames.Junk) else frames.decode_line(line, TOPICS))
    return out


def bare_loads(chunks: list[bytes]) -> list[Any]:
    return [json.loads(chunk) for chunk in chunks]


@dataclass
class Recorded:
    record_s: float
    flush_s: float
    records: list[dict[str, Any]]
    inbox_rows: list[tuple[object, ...]]


def record_all(
    directory: Path, decoded: list[frames.Frame], now: float, batch_size: int = BATCH
) -> Recorded:
    """Batches through record_batch + audit.flush on a fresh store in `directory`."""
    conn = db.connect(directory / "intake.sqlite3")
    migrations.apply(conn)
    policy = cadence.Policy()
    queue = OwnerQueue(policy, cadence.CadenceState.empty(policy))
    log = audit.AuditLog(directory / "audit", clock=lambda: now)
    record_s = flush_s = 0.0
    records: list[dict[str, Any]] = []
    try:
        for start in range(0, len(decoded), batch_size):
            batch: list[Any] = decoded[start : start + batch_size]
            at = now + start / 10_000  # the clock moves on between batches, as in a replay
            began = time.thread_time()
            result = inbox.record_batch(
                conn,
                batch,
                at,
                queue=queue,
                relay_enabled=True,
                feed_append=append_triage_entry,
                note_append=append_info_entry,
            )
            record_s += time.thread_time() - began
            began = time.thread_time()
            audit.flush(conn, log)
            flush_s += time.thread_time() - began
            records.extend(result.records)
        rows = conn.execute(
            "SELECT event_id, topic, time, expires, raw, raw_sha256, incident_key, severity,"
            " outcome, reason, delivery_key, received_at, event, sequence_id FROM inbox"
        ).fetchall()
    finally:
        log.close()
        conn.close()
    return Recorded(record_s, flush_s, records, rows)


def plain_executemany(
    directory: Path, rows: list[tuple[object, ...]], batch_size: int = BATCH
) -> float:
    """The reference: the same inbox rows, one executemany per batch, one transaction each."""
    conn = db.connect(directory / "plain.sqlite3")
    try:
        conn.execute(
            "CREATE TABLE inbox (seq INTEGER PRIMARY KEY, event_id TEXT UNIQUE NOT NULL,"
            " topic TEXT, time INTEGER, expires INTEGER, raw TEXT, raw_sha256 TEXT,"
            " incident_key TEXT, severity INTEGER, outcome TEXT, reason TEXT, delivery_key TEXT,"
            " received_at REAL, event TEXT, sequence_id TEXT)"
        )
        insert = (
            "INSERT INTO inbox(event_id, topic, time, expires, raw, raw_sha256, incident_key,"
            " severity, outcome, reason, delivery_key, received_at, event, sequence_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        began = time.thread_time()
        for start in range(0, len(rows), batch_size):
            with db.write_txn(conn):
                conn.executemany(insert, rows[start : start + batch_size])
        return time.thread_time() - began
    finally:
        conn.close()


def encode_all(records: list[dict[str, Any]]) -> list[str]:
    return [audit.encode(record) for record in records]


def bare_dumps(records: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(record) for record in records]


@dataclass
class Figures:
    decode: float
    loads: float
    record: float
    flush: float
    plain: float
    encode: float
    dumps: float


def measure(n: int, repeat: int, workdir: Path | None, batch_size: int = BATCH) -> Figures:
    chunks = backlog_lines(n)
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, seconds), seconds)

    now = float(START + 60)
    for run in range(repeat):
        keep("loads", cpu(lambda: bare_loads(chunks)))
        began = time.thread_time()
        decoded = decode_all(chunks)
        keep("decode", time.thread_time() - began)
        with tempfile.TemporaryDirectory(prefix="bench-writer-", dir=workdir) as tmp:
            recorded = record_all(Path(tmp), decoded, now, batch_size)
            keep("plain", plain_executemany(Path(tmp), recorded.inbox_rows, batch_size))
        keep("record", recorded.record_s)
        keep("flush", recorded.flush_s)
        keep("dumps", cpu(functools.partial(bare_dumps, recorded.records)))
        keep("encode", cpu(functools.partial(encode_all, recorded.records)))
        if run == 0 and len(recorded.inbox_rows) != n:
            raise RuntimeError(f"recorded {len(recorded.inbox_rows)} of {n} events")
    per_event = {name: seconds / n * 1e6 for name, seconds in best.items()}
    return Figures(**per_event)


def rows(f: Figures, n: int, batch_size: int = BATCH) -> list[Row]:
    """The figures as results-table rows, each next to its same-run reference."""
    prefix = f"writer in-process, {n:,} events, batches of {batch_size}: CPU per event"
    return [
        Row(
            f"{prefix}, decode (feed + decode_line)",
            f"{f.decode:.1f} us",
            f"bare json.loads {f.loads:.1f} us",
            ratio(f.decode, f.loads),
        ),
        Row(
            f"{prefix}, inbox.record_batch",
            f"{f.record:.1f} us",
            f"plain executemany of the inbox rows {f.plain:.1f} us",
            ratio(f.record, f.plain),
        ),
        Row(f"{prefix}, audit.flush", f"{f.flush:.1f} us"),
    ]


def profile(n: int, workdir: Path | None, top: int) -> None:
    chunks = backlog_lines(n)
    profiler = cProfile.Profile()
    with tempfile.TemporaryDirectory(prefix="bench-writer-", dir=workdir) as tmp:
        profiler.enable()
        decoded = decode_all(chunks)
        record_all(Path(tmp), decoded, float(START + 60))
        profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    parser.add_argument("--batch", type=int, default=BATCH, help="frames per record_batch")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    if args.profile:
        profile(args.events, args.dir, args.top)
        return
    f = measure(args.events, args.repeat, args.dir, args.batch)
    n = args.events
    print(
        f"{n:,} events, batches of {args.batch}, best of {args.repeat}, CPU us/event (this thread)"
    )
    print(f"decode  feed + decode_line        {f.decode:6.1f}   bare json.loads   {f.loads:5.1f}")
    print(f"record  record_batch              {f.record:6.1f}   plain executemany {f.plain:5.1f}")
    print(f"flush   audit.flush per batch     {f.flush:6.1f}")
    print(f"encode  audit.encode              {f.encode:6.1f}   bare json.dumps   {f.dumps:5.1f}")
    total = f.decode + f.record + f.flush
    print(f"total   decode + record + flush   {total:6.1f}")


if __name__ == "__main__":
    main()
