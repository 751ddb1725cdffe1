"""Live latency on both engines, interleaved in one sitting (issue 23, second round).

`bench_latency.live_latency` as `run_all.py` runs it (daemon subprocess, debounce 0, one event at
a time, each a new incident, the in-thread emulator and reference receiver), once with the store
on SQLite and once on PostgreSQL (a fresh schema on the server `NTFY_INTAKE_BENCH_DATABASE` or
`NTFY_INTAKE_TEST_DATABASE` names), `--rounds` times, alternating, so both see the same machine.
Prints each run's publish -> received and publish -> durably recorded p50 / p99, the relay's
share, the worst publish -> received of the warm-up after its first 20 events (until the
start-up overlap backfill is recorded: `bench_latency.warm_up`), and the load average when each
run ended.

Run alone: NTFY_INTAKE_TEST_DATABASE=postgresql://... uv run python bench/bench_live_engines.py
[--rounds 3] [--events 300]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import bench_latency
import bench_replay
from _common import ms, percentile


def one_run(work: Path, events: int, dsn: str | None) -> dict[str, float]:
    result = bench_latency.live_latency(work, events, database=dsn)
    share = [rx - rec for rx, rec in zip(result.received, result.recorded, strict=True)]
    return {
        "rx50": percentile(result.received, 50),
        "rx99": percentile(result.received, 99),
        "rec50": percentile(result.recorded, 50),
        "rec99": percentile(result.recorded, 99),
        "share50": percentile(share, 50),
        "share99": percentile(share, 99),
        "startup_max": max(result.startup, default=0.0),
        "startup_n": len(result.startup),
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=300)
    args = parser.parse_args()
    server = bench_replay.bench_database()
    if server is None:
        raise SystemExit("needs NTFY_INTAKE_BENCH_DATABASE or NTFY_INTAKE_TEST_DATABASE")
    lines = [
        f"live latency, n={args.events} per run, engines alternating",
        "",
        "| run | engine | received p50 / p99 | recorded p50 / p99 | relay's share p50 / p99"
        " | start-up max (n) | load |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-live-engines-") as tmp:
        for number in range(1, args.rounds + 1):
            for engine in ("sqlite", "postgresql"):
                work = Path(tmp) / f"{engine}-{number}"
                work.mkdir()
                if engine == "sqlite":
                    run = one_run(work, args.events, None)
                else:
                    with bench_replay.fresh_schema(server) as dsn:
                        run = one_run(work, args.events, dsn)
                lines.append(
                    f"| {number} | {engine} | {ms(run['rx50'])} / {ms(run['rx99'])} |"
                    f" {ms(run['rec50'])} / {ms(run['rec99'])} |"
                    f" {ms(run['share50'])} / {ms(run['share99'])} |"
                    f" {ms(run['startup_max'])} ({run['startup_n']:.0f}) | {run['load']:.2f} |"
                )
                print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
