"""The overlap backfill's cost, by hand: a backlog replay with and without it, and a resume.

- replay: N events wait on the emulator, the daemon starts with `first_start = all`; seconds from
  spawn until every event has its audit line, with the backfill kept out (`cache_settle = 1h`)
  and with the default (then also until its `backfill` record, which re-reads them all).
- resume: 40 events at 4/s, a restart: the `backfill` record's polled/new/duplicate counts.

Run alone: uv run python bench/bench_backfill.py [--events 10000]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import AuditCounter, daemon, daemon_env
from bench_replay import publish_backlog
from ntfy_intake.store import audit
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

TIMEOUT_S = 600.0


def emulator() -> NtfyEmulator:
    return NtfyEmulator(
        EmulatorConfig(keepalive_interval=1.0, manager_interval=None, request_limit=False)
    )


def backfills(state: Path) -> list[dict[str, Any]]:
    return [r for r in audit.read_records(state / "audit") if r.get("kind") == "backfill"]


def wait(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.005)


def replay(n: int, workdir: Path, *, backfill: bool) -> tuple[float, float | None]:
    state = workdir / ("with" if backfill else "without")
    with emulator().running() as emu:
        publish_backlog(emu, n, random.Random(1))
        settle = "2s" if backfill else "1h"
        env = daemon_env(emu.url, state, ntfy_first_start="all", ntfy_cache_settle=settle)
        counter = AuditCounter(state / "audit")
        spawned = time.monotonic()
        with daemon(env, workdir / f"{state.name}.log"):
            wait(lambda: counter.poll() >= n, "replay")
            done = time.monotonic() - spawned
            if not backfill:
                return done, None
            wait(lambda: backfills(state), "backfill record")
            return done, time.monotonic() - spawned


def resume(workdir: Path, events: int = 40, rate: float = 4.0) -> dict[str, Any]:
    state = workdir / "resume"
    with emulator().running() as emu:
        env = daemon_env(emu.url, state, ntfy_cache_settle="200ms")
        with daemon(env, workdir / "resume-1.log"):
            wait(lambda: len(backfills(state)) >= 1, "first backfill")
            for i in range(events):
                emu.publish("alerts", f"steady {i}", title=f"steady {i % 7}")
                time.sleep(1 / rate)
            counter = AuditCounter(state / "audit")
            wait(lambda: counter.poll() >= events, "recorded")
            time.sleep(1.0)  # the cursor settles
        with daemon(env, workdir / "resume-2.log"):
            wait(lambda: len(backfills(state)) >= 2, "second backfill")
        return backfills(state)[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-backfill-"))
    try:
        without, _ = replay(args.events, workdir, backfill=False)
        with_done, record_at = replay(args.events, workdir, backfill=True)
        record = resume(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"replay of {args.events}, backfill kept out: all audited {without:.2f} s after spawn")
    print(
        f"replay of {args.events}, with the backfill: all audited {with_done:.2f} s after spawn,"
        f" backfill record {record_at:.2f} s after spawn"
    )
    keys = ("polled", "new", "duplicate")
    print("resume after 40 events at 4/s:", {k: record[k] for k in keys})
    return 0


if __name__ == "__main__":
    sys.exit(main())
