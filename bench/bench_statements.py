"""A write transaction's statements on PostgreSQL: held and sent as one query, against psycopg's
pipeline (issue 23, third round; the reason store/postgres.py holds them).

The same transaction both ways, in one run on the same server and table: BEGIN, `--statements`
INSERTs of a live batch's shape (text, bigint, double precision, a JSON payload), COMMIT.

- pipeline: psycopg's pipeline mode, the statements prepared by the driver after their fifth
  use, each `execute` sending its statement as it comes (a poll and a send per statement);
- held: each statement's parameters quoted by the driver (`ClientCursor.mogrify`), the whole
  transaction sent as one simple-protocol query and answered at once.

Prints the client's CPU and the wall time per transaction for both, and their ratios. The server
parses the held statements every time (no prepared plan): its share is in the wall time.

Run alone: NTFY_INTAKE_TEST_DATABASE=postgresql://... uv run python bench/bench_statements.py
[--transactions 500] [--statements 20]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import psycopg

import bench_replay
from ntfy_intake.store.postgres import translate

INSERT = "INSERT INTO bench_statements (key, seq, at, payload) VALUES (?, ?, ?, ?)"
PAYLOAD = json.dumps(
    {"events": [{"id": "aaaaaaaaaaa1", "title": "Disk full", "message": "x" * 200}]}
)


def measure(run: Callable[[], None], transactions: int) -> tuple[float, float]:
    """(CPU, wall) per transaction, in ms."""
    for _ in range(20):
        run()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(transactions):
        run()
    return (
        (time.process_time() - cpu) * 1000 / transactions,
        (time.perf_counter() - wall) * 1000 / transactions,
    )


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

        print(f"one transaction of {args.statements} INSERTs, {args.transactions} per run\n")
        print("| round | pipeline CPU / wall | held CPU / wall | CPU ratio | wall ratio |")
        print("|---|---|---|---|---|")
        for number in range(1, args.rounds + 1):
            piped_cpu, piped_wall = measure(pipeline, args.transactions)
            held_cpu, held_wall = measure(held, args.transactions)
            print(
                f"| {number} | {piped_cpu:.3f} / {piped_wall:.3f} ms"
                f" | {held_cpu:.3f} / {held_wall:.3f} ms"
                f" | {piped_cpu / held_cpu:.2f}x | {piped_wall / held_wall:.2f}x |"
            )


if __name__ == "__main__":
    main()
