"""Live latency in detail: publish -> durably recorded -> received, per event, with a floor.

The same measurement as `bench_latency.py`'s live rows (daemon subprocess, debounce 0, the
in-thread emulator and reference receiver, one event at a time, each a new incident), with
what that one does not give: p90 and max besides p50/p99, the durable-write floor, and with
`--stamps FILE` every event's id and its three times (time.monotonic(), the same clock as the
daemon's `loop.time()` on Linux), for a per-stage breakdown against stamps taken in the daemon.
`--poll` sets how often this process looks at the audit log (default 0.5 ms, as bench_latency).
`--settled` publishes the next event only once the previous delivery is settled (its `delivery`
audit line written), as alerts minutes apart arrive; by default the next event is published as
soon as the receiver saw the previous one, while that POST's reply, its settle and its audit
line are still on their way (bench_latency's method), and the relay claims no new row until
they are done.

Run alone: uv run python bench/bench_live.py [--events 300] [--stamps out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import AuditCounter, daemon, daemon_env, ms, percentile
from bench_latency import probe, warm_up
from ntfy_intake.store import audit
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

STEP_TIMEOUT_S = 10.0


@dataclass
class Run:
    published: dict[str, float] = field(default_factory=dict)
    recorded: dict[str, float] = field(default_factory=dict)
    received: dict[str, float] = field(default_factory=dict)
    floor: list[float] = field(default_factory=list)

    def latencies(self, which: dict[str, float]) -> list[float]:
        return [which[i] - self.published[i] for i in self.published if i in which]


def durable_floor(directory: Path, n: int) -> list[float]:
    """One INSERT transaction (WAL, FULL) + one fsynced line: the least 'durably recorded' costs."""
    conn = sqlite3.connect(directory / "floor.sqlite3", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE inbox (event_id TEXT PRIMARY KEY, raw TEXT NOT NULL)")
    fd = os.open(directory / "floor.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    times = []
    try:
        for i in range(n):
            began = time.monotonic()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO inbox VALUES (?, ?)", (str(i), "x" * 300))
            conn.execute("COMMIT")
            os.write(fd, b'{"kind":"event","event_id":"%d"}\n' % i)
            os.fsync(fd)
            times.append(time.monotonic() - began)
    finally:
        os.close(fd)
        conn.close()
    return times


class DeliveryCounter:
    """Counts `delivery` audit lines as the log grows (complete lines only)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.count = 0
        self._offsets: dict[Path, int] = {}

    def poll(self) -> int:
        for path in audit.log_files(self.directory):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            end = data.rfind(b"\n") + 1
            self.count += data[:end].count(b'"kind":"delivery"')
            self._offsets[path] = offset + end
        return self.count


def live(workdir: Path, n: int, poll: float, *, settled: bool = False) -> Run:
    run = Run()
    arrived = threading.Condition()

    def decide(body: dict[str, object]) -> dict[str, object] | None:
        now = time.monotonic()
        events = body.get("events")
        with arrived:
            for event in events if isinstance(events, list) else []:
                run.received.setdefault(str(event["id"]), now)
            arrived.notify_all()
        return None

    state = workdir / "live"
    with contextlib.ExitStack() as stack:
        emu = stack.enter_context(
            NtfyEmulator(EmulatorConfig(keepalive_interval=1.0, manager_interval=None)).running()
        )
        handle = stack.enter_context(receiver.running(workdir / "rx.sqlite3", decide=decide))
        env = daemon_env(emu.url, state, relay_url=handle.url, cadence_debounce="0s")
        stack.enter_context(daemon(env, workdir / "live.log"))
        emu.wait_for_subscribers(1, timeout=30)
        counter = AuditCounter(state / "audit")
        deliveries = DeliveryCounter(state / "audit")

        def warming(i: int) -> float:
            began, _, got = probe(emu, counter, arrived, run.received, i, "live probe", poll=poll)
            return got - began

        sent, _ = warm_up(counter, warming)
        for i in range(sent, sent + n):
            if settled:
                deadline = time.monotonic() + STEP_TIMEOUT_S
                while deliveries.poll() < i:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"delivery {i} not settled")
                    time.sleep(poll)
            ids: list[str] = []
            began, seen, _ = probe(
                emu, counter, arrived, run.received, i, "live probe", poll=poll, ids=ids
            )
            event_id = ids[0]
            run.published[event_id] = began
            run.recorded[event_id] = seen
    run.floor = durable_floor(workdir, n)
    return run


def summary(name: str, values: list[float]) -> str:
    p = [ms(percentile(values, q)) for q in (50, 90, 99)]
    return f"{name:<34} p50 {p[0]:>9}  p90 {p[1]:>9}  p99 {p[2]:>9}  max {ms(max(values)):>9}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--poll", type=float, default=0.0005)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--stamps", type=Path, default=None)
    parser.add_argument("--settled", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-live-", dir=args.dir) as tmp:
        run = live(Path(tmp), args.events, args.poll, settled=args.settled)
    print(summary("publish -> durably recorded", run.latencies(run.recorded)))
    print(summary("publish -> received", run.latencies(run.received)))
    print(summary("durable-write floor", run.floor))
    if args.stamps is not None:
        rows = {
            i: {"published": t, "recorded": run.recorded[i], "received": run.received.get(i)}
            for i, t in run.published.items()
        }
        args.stamps.write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
