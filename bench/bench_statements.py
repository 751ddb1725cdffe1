"""A write transaction's statements on PostgreSQL three ways, client and server CPU (issue 23,
third round: why store/postgres.py still pipelines them, and what might beat it).

The same transaction each way, in one run on the same server and table: BEGIN, `--statements`
INSERTs of a live batch's shape (text, bigint, double precision, a JSON payload), COMMIT.

- pipeline (what the store does): psycopg's pipeline mode, each statement prepared by the
  driver after its fifth use and sent as it comes (a poll and a send per statement);
- held: each statement's parameters quoted by the driver (`ClientCursor.mogrify`), the whole
  transaction sent as one simple-protocol query: the server parses and plans every statement;
- held, prepared: the statement PREPAREd once on the session, the transaction sent as one query
  of `EXECUTE name(literals)`.

Prints, per transaction, this process's CPU, the server backend's CPU (its /proc entry: a server
on this box; "n/a" otherwise) and the wall time, each way, and each against the pipeline.
The store tried "held" in its third round: the daemon's CPU per live event fell 8.1 -> 6.1 ms,
the server's rose 3.7 -> 5.1 ms, and the latency did not move (docs/performance.md).

Run alone: NTFY_INTAKE_TEST_DATABASE=postgresql://... uv run python bench/bench_statements.py
[--transactions 500] [--statements 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

import bench_replay
from ntfy_intake.store.postgres import translate

INSERT = "INSERT INTO bench_statements (key, seq, at, payload) VALUES (?, ?, ?, ?)"
PAYLOAD = json.dumps(
    {"events": [{"id": "aaaaaaaaaaa1", "title": "Disk full", "message": "x" * 200}]}
)


TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float | None:
    """The server backend's CPU so far (s), None when it is not on this box."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def measure(run: Callable[[], None], transactions: int, backend: int) -> tuple[float, ...]:
    """(client CPU, server CPU or -1, wall) per transaction, in ms."""
    for _ in range(20):
        run()
    server, cpu, wall = backend_cpu(backend), time.process_time(), time.perf_counter()
    for _ in range(transactions):
        run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    after = backend_cpu(backend)
    served = -1.0 if server is None or after is None else after - server
    return tuple(x * 1000 / transactions if x >= 0 else -1.0 for x in (cpu, served, wall))


def shown(figures: tuple[float, ...]) -> str:
    client, server, wall = figures
    return f"{client:.3f} / {'n/a' if server < 0 else f'{server:.3f}'} / {wall:.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=500)
    parser.add_argument("--statements", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = bench_replay.bench_database()
    if server is None:
        raise SystemExit("needs NTFY_INTAKE_BENCH_DATABASE or NTFY_INTAKE_TEST_DATABASE")
    sql = translate(INSERT)
    with bench_replay.fresh_schema(server) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bench_statements"
            " (key TEXT, seq BIGINT, at DOUBLE PRECISION, payload TEXT)"
        )
        conn.execute("SET synchronous_commit = off")  # the disk is not what is compared
        quoting = psycopg.ClientCursor(conn)
        rows: list[tuple[Any, ...]] = [
            (f"alerts:incident {n}", n, 1_764_470_100.0 + n, PAYLOAD)
            for n in range(args.statements)
        ]

        def pipeline() -> None:
            with conn.pipeline():
                conn.execute("BEGIN")
                for row in rows:
                    conn.execute(sql, row)
                conn.execute("COMMIT")

        def held() -> None:
            statements = ["BEGIN", *(quoting.mogrify(sql, row) for row in rows), "COMMIT"]
            conn.execute(";".join(statements).encode(), prepare=False)

        parts = sql.split("%s")
        numbered = "".join(f"{part}${n}" for n, part in enumerate(parts[:-1], 1)) + parts[-1]
        conn.execute(f"PREPARE bench_insert AS {numbered}".encode(), prepare=False)
        execute = "EXECUTE bench_insert(" + ", ".join(["%s"] * 4) + ")"

        def prepared() -> None:
            statements = ["BEGIN", *(quoting.mogrify(execute, row) for row in rows), "COMMIT"]
            conn.execute(";".join(statements).encode(), prepare=False)

        backend = conn.info.backend_pid
        print(f"one transaction of {args.statements} INSERTs, {args.transactions} per run")
        print("each: client CPU / server CPU / wall per transaction\n")
        print("| round | pipeline | held | held, prepared | client CPU against the pipeline |")
        print("|---|---|---|---|---|")
        for number in range(1, args.rounds + 1):
            piped = measure(pipeline, args.transactions, backend)
            plain = measure(held, args.transactions, backend)
            ready = measure(prepared, args.transactions, backend)
            print(
                f"| {number} | {shown(piped)} | {shown(plain)} | {shown(ready)}"
                f" | {piped[0] / plain[0]:.2f}x / {piped[0] / ready[0]:.2f}x |"
            )


if __name__ == "__main__":
    main()
