"""Backlog replay: N events wait on the emulator when the daemon starts (`first_start = all`).

Measured: from spawning `ntfy-intake run` until every event has its audit line (flushed and
fsynced, so also committed in SQLite), polled from this process every 5 ms. Reported both from the
spawn (includes interpreter start-up and local recovery) and from the moment the stream opened.
Reference, same run, same directory: a plain sqlite3 loop, one INSERT of the same raw frames per
transaction, WAL + synchronous=FULL (what a naive "one commit per event" intake does).
Also: the daemon's peak RSS (VmHWM) at the end of the replay.

Run alone: uv run python bench/bench_replay.py [--events 10000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _common import AuditCounter, Row, daemon, daemon_env, met, proc_status, ratio
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

TARGET_RATIO = 3.0
INCIDENTS = 50
TIMEOUT_S = 600.0


@dataclass
class Replay:
    events: int
    spawn_to_done_s: float
    open_to_done_s: float
    plain_s: float
    peak_rss_kib: int

    @property
    def rate(self) -> float:
        return self.events / self.spawn_to_done_s

    @property
    def rate_from_open(self) -> float:
        return self.events / self.open_to_done_s

    @property
    def plain_rate(self) -> float:
        return self.events / self.plain_s


def publish_backlog(emu: NtfyEmulator, n: int, rng: random.Random) -> None:
    for i in range(n):
        incident = rng.randrange(INCIDENTS)
        emu.publish(
            "alerts" if i % 3 else "backups",
            f"backlog event #{i}: disk usage {rng.randint(80, 99)}% on volume {incident}",
            title=f"incident {incident}",
            priority=rng.choice((2, 3, 3, 4, 5)),
        )


def plain_loop(directory: Path, frames: list[tuple[str, str]]) -> float:
    """One INSERT per transaction, WAL, synchronous=FULL: seconds for all frames."""
    path = directory / "plain-loop.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(
            "CREATE TABLE inbox (event_id TEXT PRIMARY KEY, raw TEXT NOT NULL, received_at REAL)"
        )
        began = time.perf_counter()
        for event_id, raw in frames:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO inbox VALUES (?, ?, ?)", (event_id, raw, time.time()))
            conn.execute("COMMIT")
        return time.perf_counter() - began
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def replay(n: int, workdir: Path, *, seed: int = 1) -> Replay:
    state = workdir / f"replay-{n}"
    with NtfyEmulator(
        EmulatorConfig(keepalive_interval=1.0, manager_interval=None)
    ).running() as emu:
        publish_backlog(emu, n, random.Random(seed))
        frames = [(m["id"], json.dumps(m, separators=(",", ":"))) for m in emu.messages()]
        env = daemon_env(emu.url, state, ntfy_first_start="all")
        counter = AuditCounter(state / "audit")
        spawned = time.monotonic()
        opened: float | None = None
        with daemon(env, workdir / f"replay-{n}.log") as proc:
            while counter.poll() < n:
                if opened is None and emu.subscriber_count() >= 1:
                    opened = time.monotonic()
                if proc.poll() is not None:
                    raise RuntimeError(f"daemon exited {proc.returncode} during the replay")
                if time.monotonic() - spawned > TIMEOUT_S:
                    raise TimeoutError(f"replay of {n} not done after {TIMEOUT_S} s")
                time.sleep(0.005)
            done = time.monotonic()
            peak = proc_status(proc.pid).get("VmHWM", 0)
    plain_s = plain_loop(state, frames)
    return Replay(n, done - spawned, done - (opened or spawned), plain_s, peak)


# -- fsync calls (why batching wins where fsync is slow) ---------------------------------------------

PLAIN_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bench_replay import plain_loop
n = int(sys.argv[3])
plain_loop(Path(sys.argv[2]), [(f"id{i:08d}", "x" * 300) for i in range(n)])
"""


def _strace(out: Path, argv: list[str]) -> list[str]:
    return ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", str(out), *argv]


def _count_fsyncs(trace: Path) -> int:
    calls = 0
    with trace.open() as handle:
        for line in handle:
            if "fsync(" in line or "fdatasync(" in line:
                calls += 1
    return calls


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def fsync_counts(n: int, workdir: Path) -> tuple[int, int] | None:
    """fsync + fdatasync calls for an n-event replay (daemon) and for the plain loop, or None
    when strace is not installed."""
    if shutil.which("strace") is None:
        return None
    state = workdir / f"strace-{n}"
    trace = workdir / f"strace-daemon-{n}.txt"
    with NtfyEmulator(
        EmulatorConfig(keepalive_interval=1.0, manager_interval=None)
    ).running() as emu:
        publish_backlog(emu, n, random.Random(2))
        env = daemon_env(emu.url, state, ntfy_first_start="all")
        counter = AuditCounter(state / "audit")
        with (workdir / "strace-daemon.log").open("ab") as log:
            tracer = subprocess.Popen(
                _strace(trace, [sys.executable, "-m", "ntfy_intake", "run"]),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                deadline = time.monotonic() + TIMEOUT_S
                while counter.poll() < n:
                    if tracer.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("traced daemon exited or did not finish")
                    time.sleep(0.01)
                for pid in _children(tracer.pid):
                    os.kill(pid, signal.SIGTERM)
                tracer.wait(60)
            finally:
                if tracer.poll() is None:
                    for pid in _children(tracer.pid):
                        os.kill(pid, signal.SIGKILL)
                    tracer.kill()
                    tracer.wait(10)
    daemon_calls = _count_fsyncs(trace)
    plain_trace = workdir / f"strace-plain-{n}.txt"
    plain_dir = workdir / "strace-plain"
    plain_dir.mkdir()
    bench_dir = str(Path(__file__).resolve().parent)
    subprocess.run(
        _strace(
            plain_trace, [sys.executable, "-c", PLAIN_CHILD, bench_dir, str(plain_dir), str(n)]
        ),
        check=True,
    )
    return daemon_calls, _count_fsyncs(plain_trace)


def fsync_rows(n: int, counts: tuple[int, int] | None) -> list[Row]:
    if counts is None:
        return [Row("fsync calls per 1,000 events", "- (strace not installed)")]
    daemon_calls, plain_calls = counts
    return [
        Row(
            f"fsync calls per 1,000 events ({n:,} replay, strace)",
            f"{daemon_calls * 1000 / n:,.1f}",
            f"plain loop {plain_calls * 1000 / n:,.1f}",
            ratio(daemon_calls, plain_calls),
        )
    ]


def rows(result: Replay) -> list[Row]:
    n = result.events
    return [
        Row(
            f"backlog replay {n:,} events (spawn -> all audited)",
            f"{result.rate:,.0f} ev/s ({result.spawn_to_done_s:.2f} s)",
            f"plain 1-INSERT/txn loop {result.plain_rate:,.0f} ev/s ({result.plain_s:.2f} s)",
            ratio(result.rate, result.plain_rate),
            f">= {TARGET_RATIO:g}x",
            met(result.rate >= TARGET_RATIO * result.plain_rate),
        ),
        Row(
            f"  same, from stream open ({n:,})",
            f"{result.rate_from_open:,.0f} ev/s ({result.open_to_done_s:.2f} s)",
            f"plain loop {result.plain_rate:,.0f} ev/s",
            ratio(result.rate_from_open, result.plain_rate),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-replay-", dir=args.dir) as tmp:
        result = replay(args.events, Path(tmp))
    for row in rows(result):
        print(row)
    with tempfile.TemporaryDirectory(prefix="bench-replay-", dir=args.dir) as tmp:
        for row in fsync_rows(3000, fsync_counts(3000, Path(tmp))):
            print(row)
    print(f"peak RSS {result.peak_rss_kib / 1024:.1f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
