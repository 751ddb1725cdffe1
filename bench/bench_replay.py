"""Backlog replay: N events wait on the emulator when the daemon starts (`first_start = all`).

Measured: from spawning `ntfy-intake run` until every event has its audit line (flushed and
fsynced, so also committed in SQLite), polled from this process every 5 ms. Reported both from the
spawn (includes interpreter start-up and local recovery) and from the moment the stream opened.
Reference, same run, same directory: a plain sqlite3 loop, one INSERT of the same raw frames per
transaction, WAL + synchronous=FULL (what a naive "one commit per event" intake does).
Also: the daemon's peak RSS (VmHWM) once the overlap backfill has re-read the backlog, and its CPU
time (user+sys) per event from stream open. Sources: the emulator as it is, the emulator writing
one flushed chunk per frame (`flush_each_frame`), and the real ntfy server when NTFY_BIN is set
(tests/real_ntfy.py starts it; without it those rows say why they are skipped).

Run alone: uv run python bench/bench_replay.py [--events 10000] [--source real] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from _common import (
    AuditCounter,
    LogWatch,
    Row,
    daemon,
    daemon_env,
    met,
    proc_cpu_s,
    proc_status,
    ratio,
    wait_for,
)
from ntfy_intake.store import db
from ntfy_intake.testbed import drill_store
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.real_ntfy import RealNtfy  # the tests' helper that starts `ntfy serve`

TARGET_RATIO = 3.0  # from stream open
TARGET_SPAWN_RATIO = 2.0  # from spawn
TARGET_CPU_US = 30.0
INCIDENTS = 50
TIMEOUT_S = 600.0


SOURCES = ("emulator", "emulator-flush", "real", "emulator-postgresql")
SOURCE_NAMES = {
    "emulator": "emulator",
    "emulator-flush": "emulator, 1 flushed chunk/frame",
    "real": "real ntfy 2.13",
    "emulator-postgresql": "emulator into PostgreSQL",
}
# Issue 23: the PostgreSQL rows run against this server (a throwaway one: a schema is made and
# dropped), the tests' DSN by default.
DATABASE_ENV = ("NTFY_INTAKE_BENCH_DATABASE", "NTFY_INTAKE_TEST_DATABASE")


@dataclass
class Replay:
    events: int
    source: str
    spawn_to_done_s: float
    open_to_done_s: float
    spawn_to_subscribed_s: float
    plain_s: float
    peak_rss_kib: int  # VmHWM once the overlap backfill has re-read the backlog too
    cpu_s: float  # daemon user+sys from stream open until all audited
    backfill_s: float | None = None  # spawn -> the backfill's audit record

    @property
    def rate(self) -> float:
        return self.events / self.spawn_to_done_s

    @property
    def rate_from_open(self) -> float:
        return self.events / self.open_to_done_s

    @property
    def plain_rate(self) -> float:
        return self.events / self.plain_s

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_s / self.events * 1e6


def backlog(n: int, rng: random.Random) -> list[tuple[str, str, str, int]]:
    out = []
    for i in range(n):
        incident = rng.randrange(INCIDENTS)
        out.append(
            (
                "alerts" if i % 3 else "backups",
                f"backlog event #{i}: disk usage {rng.randint(80, 99)}% on volume {incident}",
                f"incident {incident}",
                rng.choice((2, 3, 3, 4, 5)),
            )
        )
    return out


def publish_backlog(emu: NtfyEmulator, n: int, rng: random.Random) -> None:
    for topic, message, title, priority in backlog(n, rng):
        emu.publish(topic, message, title=title, priority=priority)


def publish_backlog_real(url: str, n: int, rng: random.Random) -> list[dict[str, object]]:
    """8 publishers at once (ntfy takes ~2.5 ms a publish); the replay order is ntfy's."""
    items = backlog(n, rng)
    with httpx.Client(timeout=30) as client, ThreadPoolExecutor(8) as pool:

        def put(item: tuple[str, str, str, int]) -> dict[str, object]:
            topic, message, title, priority = item
            response = client.put(
                f"{url}/{topic}",
                content=message.encode(),
                headers={"Title": title, "Priority": str(priority)},
            )
            response.raise_for_status()
            event: dict[str, object] = response.json()
            return event

        return list(pool.map(put, items))


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


def bench_database() -> str | None:
    return next((os.environ[name] for name in DATABASE_ENV if os.environ.get(name)), None)


@contextlib.contextmanager
def fresh_schema(server: str) -> Iterator[str]:
    """A DSN whose search path is a new, empty schema on `server`, dropped afterwards."""
    with drill_store.own_schema(server, prefix="bench") as (_, dsn):
        yield dsn


def plain_loop_postgresql(dsn: str, frames: list[tuple[str, str]]) -> float:
    """The same reference on PostgreSQL: psycopg, one INSERT per transaction,
    synchronous_commit = on (each COMMIT waits for its WAL flush)."""
    conn = db.connect(dsn)
    try:
        conn.execute("SET synchronous_commit = on")
        conn.execute(
            "CREATE TABLE plain_loop (event_id TEXT PRIMARY KEY, raw TEXT NOT NULL,"
            " received_at DOUBLE PRECISION)"
        )
        began = time.perf_counter()
        for event_id, raw in frames:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO plain_loop VALUES (?, ?, ?)", (event_id, raw, time.time()))
            conn.execute("COMMIT")
        return time.perf_counter() - began
    finally:
        conn.execute("DROP TABLE IF EXISTS plain_loop")
        conn.close()


def real_unavailable() -> str | None:
    """Why the real-server rows are skipped, or None when NTFY_BIN names a binary."""
    binary = os.environ.get("NTFY_BIN")
    if not binary:
        return "NTFY_BIN not set"
    if not os.access(binary, os.X_OK):
        return f"NTFY_BIN={binary} is not executable"
    return None


@contextlib.contextmanager
def backlog_server(
    source: str, workdir: Path, n: int, seed: int
) -> Iterator[tuple[str, list[str]]]:
    """The backlog waiting on `source`: its base URL and the raw frames (for the plain loop)."""
    if source == "real":
        real = RealNtfy(workdir / f"ntfy-{n}", keepalive_interval=5).start()
        try:
            events = publish_backlog_real(real.url, n, random.Random(seed))
            yield real.url, [json.dumps(e, separators=(",", ":")) for e in events]
        finally:
            real.stop()
        return
    config = EmulatorConfig(
        keepalive_interval=1.0,
        manager_interval=None,
        flush_each_frame=source == "emulator-flush",
    )
    with NtfyEmulator(config).running() as emu:
        publish_backlog(emu, n, random.Random(seed))
        yield emu.url, [json.dumps(m, separators=(",", ":")) for m in emu.messages()]


def replay(n: int, workdir: Path, *, source: str = "emulator", seed: int = 1) -> Replay:
    if source == "emulator-postgresql":
        server = bench_database()
        assert server is not None
        with fresh_schema(server) as dsn:
            return _replay(n, workdir, source, seed, dsn)
    return _replay(n, workdir, source, seed, None)


def _replay(n: int, workdir: Path, source: str, seed: int, database: str | None) -> Replay:
    state = workdir / f"replay-{source}-{n}"
    log_path = workdir / f"replay-{source}-{n}.log"
    keepalive = "5s" if source == "real" else "1s"  # ntfy's least keepalive interval is 5 s
    with backlog_server(source, workdir, n, seed) as (url, raws):
        env = daemon_env(url, state, ntfy_first_start="all", ntfy_keepalive_interval=keepalive)
        if database is not None:
            env["NTFY_INTAKE_STATE_DATABASE"] = database
        counter = AuditCounter(state / "audit")
        subscribed = LogWatch(log_path, b'"intake.connected"')
        spawned = time.monotonic()
        opened: float | None = None
        cpu_open = 0.0
        with daemon(env, log_path) as proc:
            while counter.poll() < n:
                if opened is None and subscribed.seen():
                    opened = time.monotonic()
                    cpu_open = proc_cpu_s(proc.pid)
                if proc.poll() is not None:
                    raise RuntimeError(f"daemon exited {proc.returncode} during the replay")
                if time.monotonic() - spawned > TIMEOUT_S:
                    raise TimeoutError(f"replay of {n} not done after {TIMEOUT_S} s")
                time.sleep(0.005)
            done = time.monotonic()
            cpu_s = proc_cpu_s(proc.pid) - cpu_open
            # The overlap backfill re-reads the whole backlog after cache_settle: its memory
            # counts in the peak, so the peak is read once its record is written.
            backfill_s: float | None = None
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: counter.poll() >= 0 and counter.backfills > 0, 60, "backfill")
                backfill_s = time.monotonic() - spawned
            peak = proc_status(proc.pid).get("VmHWM", 0)
    frames = [(str(json.loads(raw)["id"]), raw) for raw in raws]
    plain_s = (
        plain_loop(state, frames) if database is None else plain_loop_postgresql(database, frames)
    )
    opened = opened or spawned
    return Replay(
        events=n,
        source=source,
        spawn_to_done_s=done - spawned,
        open_to_done_s=done - opened,
        spawn_to_subscribed_s=opened - spawned,
        plain_s=plain_s,
        peak_rss_kib=peak,
        cpu_s=cpu_s,
        backfill_s=backfill_s,
    )


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
    n, name = result.events, SOURCE_NAMES[result.source]
    return [
        Row(
            f"replay {n:,} from {name}: stream open -> all audited",
            f"{result.rate_from_open:,.0f} ev/s ({result.open_to_done_s:.2f} s)",
            f"plain 1-INSERT/txn FULL loop {result.plain_rate:,.0f} ev/s ({result.plain_s:.2f} s)",
            ratio(result.rate_from_open, result.plain_rate),
            f">= {TARGET_RATIO:g}x",
            met(result.rate_from_open >= TARGET_RATIO * result.plain_rate),
        ),
        Row(
            f"  same, spawn -> all audited (subscribed after {result.spawn_to_subscribed_s:.2f} s)",
            f"{result.rate:,.0f} ev/s ({result.spawn_to_done_s:.2f} s)",
            f"plain loop {result.plain_rate:,.0f} ev/s",
            ratio(result.rate, result.plain_rate),
            f">= {TARGET_SPAWN_RATIO:g}x",
            met(result.rate >= TARGET_SPAWN_RATIO * result.plain_rate),
        ),
        Row(
            "  daemon CPU (user+sys) per replayed event, from stream open",
            f"{result.cpu_us_per_event:.1f} us",
            f"plain loop wall {result.plain_s / n * 1e6:.1f} us/event",
            ratio(result.cpu_us_per_event, result.plain_s / n * 1e6),
            f"<= {TARGET_CPU_US:g} us",
            met(result.cpu_us_per_event <= TARGET_CPU_US),
        ),
    ]


def skipped_rows(n: int, source: str, why: str) -> list[Row]:
    return [Row(f"replay {n:,} from {SOURCE_NAMES[source]}", f"- (skipped: {why})")]


def run_source(n: int, workdir: Path, source: str) -> tuple[list[Row], Replay | None]:
    why = real_unavailable() if source == "real" else None
    if source == "emulator-postgresql" and bench_database() is None:
        why = f"no PostgreSQL server: set {DATABASE_ENV[0]} to a throwaway server's DSN"
    if why is not None:
        return skipped_rows(n, source, why), None
    result = replay(n, workdir, source=source)
    return rows(result), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    parser.add_argument("--source", choices=SOURCES, action="append")
    parser.add_argument("--no-strace", action="store_true")
    args = parser.parse_args()
    result = None
    for source in args.source or SOURCES:
        with tempfile.TemporaryDirectory(prefix="bench-replay-", dir=args.dir) as tmp:
            found, result = run_source(args.events, Path(tmp), source)
        for row in found:
            print(row, flush=True)
    if args.no_strace:
        return
    with tempfile.TemporaryDirectory(prefix="bench-replay-", dir=args.dir) as tmp:
        for row in fsync_rows(3000, fsync_counts(3000, Path(tmp))):
            print(row)
    if result is not None:
        print(f"peak RSS {result.peak_rss_kib / 1024:.1f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
