"""Live latency and relay throughput, daemon as a real subprocess.

Live latency (publish -> durably recorded -> received by the triage receiver), one event at a time:
- t0: just before `emu.publish(...)` (the in-thread emulator hands it to the open stream);
- recorded: this process sees the event's audit line (written after flush + fsync, so the SQLite
  commit is durable too), polling the file every 0.5 ms;
- received: the in-thread reference receiver's `decide` hook runs for the request (inside the
  receiver's own transaction, before its commit).
Every event opens a new incident, so each one is a triage request (debounce 0). All three times
come from time.monotonic() in this process. Reference, same disk: the floor of "durably
recorded", one SQLite INSERT transaction (WAL, synchronous=FULL) plus one appended, fsynced line.

Relay throughput: N distinct incidents wait on the emulator, the daemon starts with
`first_start = all`, debounce 0, and relays N triage requests to the reference receiver running as
its own process (`ntfy-intake receiver`). Deliveries/s is N over the span of the receipts'
`received_at`. Reference: a plain httpx loop in this process POSTing N requests of the same shape
(fresh keys) to the same receiver, one after the other.

One relay POST (`--only post`): CPU per POST of the relay's own client (`KeepAlivePoster`, h11 over
an asyncio Protocol) to a null receiver process, against httpx's AsyncClient POSTing the same
requests, alternating in the same run (docs/performance.md, "Fast paths: kept or returned to the
library").

Run alone: uv run python bench/bench_latency.py [--events 500] [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

from _common import (
    AuditCounter,
    FileWrites,
    Row,
    daemon,
    daemon_env,
    free_port,
    met,
    ms,
    percentile,
    proc_cpu_s,
    ratio,
    render,
    wait_for,
)
from ntfy_intake import __version__
from ntfy_intake.flow import relay
from ntfy_intake.rules import cadence
from ntfy_intake.runtime import logs
from ntfy_intake.store import audit, migrations, outbox
from ntfy_intake.store import db as dbmod
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire import http_post

WARMUP = 20
STARTUP_TIMEOUT_S = 30.0
TARGET_P50_S = 0.003
TARGET_P99_S = 0.010
TARGET_RELAY_RATE = 1000.0
PLAIN_CONCURRENCY = relay.DEFAULT_CONCURRENCY
STEP_TIMEOUT_S = 10.0


@dataclass
class Latency:
    recorded: list[float]
    received: list[float]
    floor: list[float]
    post_only: list[float]  # a plain POST from this process to the same receiver -> decide
    # publish -> received of the warm-up's events after the first WARMUP (`warm_up`): those
    # published while the start-up overlap backfill was polled and recorded among them
    startup: list[float] = field(default_factory=list)


def durable_floor(directory: Path, n: int) -> list[float]:
    """One INSERT transaction (WAL, FULL) + one fsynced line: the least 'durably recorded' costs."""
    path = directory / "floor.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE inbox (event_id TEXT PRIMARY KEY, raw TEXT NOT NULL)")
    fd = os.open(directory / "floor.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    line = b'{"kind":"event","event_id":"%d","outcome":"triage_requested"}\n'
    times = []
    try:
        for i in range(n):
            began = time.monotonic()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO inbox VALUES (?, ?)", (str(i), "x" * 300))
            conn.execute("COMMIT")
            os.write(fd, line % i)
            os.fsync(fd)
            times.append(time.monotonic() - began)
    finally:
        os.close(fd)
        conn.close()
    return times


# The reference receiver in a process of its own, printing "<event id> <monotonic>" from `decide`
# (CLOCK_MONOTONIC is one clock for every process on the machine), until its stdin closes.
STAMPING_RECEIVER = """
import sys, time
from pathlib import Path
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.testbed import receiver

def decide(body):
    now = time.monotonic()
    for event in body.get("events") or []:
        sys.stdout.write(f"{event['id']} {now:.6f}\\n")
    sys.stdout.flush()
    return None

app = receiver.create_app(Path(sys.argv[1]), decide=decide)
with _serve.serving(app) as base:
    print("url " + base + "/triage", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def stamping_receiver(
    db_path: Path, received_at: dict[str, float], arrived: threading.Condition
) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", STAMPING_RECEIVER, str(db_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    first = proc.stdout.readline()
    if not first.startswith("url "):
        proc.kill()
        raise RuntimeError("the receiver process did not start")

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            fields = line.split()
            if len(fields) != 2 or not fields[1].replace(".", "", 1).isdigit():
                continue  # a log line of the receiver's
            with arrived:
                received_at[fields[0]] = float(fields[1])
                arrived.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield first.split()[1]
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        proc.stdout.close()


def probe(
    emu: NtfyEmulator,
    counter: AuditCounter,
    arrived: threading.Condition,
    received_at: dict[str, float],
    i: int,
    title: str,
    *,
    poll: float = 0.0005,
    ids: list[str] | None = None,
    writes: FileWrites | None = None,
) -> tuple[float, float, float]:
    """Publish probe `i`; (published, durably recorded, received at the receiver), monotonic.
    The audit files are looked at after each write to them (`writes`), else every `poll`
    seconds; `ids` gets the event's id."""
    began = time.monotonic()
    event_id = emu.publish("alerts", f"probe #{i}", title=f"{title} {i}")["id"]
    if ids is not None:
        ids.append(event_id)
    deadline = began + STEP_TIMEOUT_S
    while event_id not in counter.ids:
        counter.poll()
        if event_id in counter.ids:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"event {event_id} not recorded")
        if writes is None:
            time.sleep(poll)
        else:
            writes.wait(0.05)
    seen = time.monotonic()
    with arrived:
        if not arrived.wait_for(lambda: event_id in received_at, STEP_TIMEOUT_S):
            raise TimeoutError(f"event {event_id} not received")
        return began, seen, received_at[event_id]


def live_latency(
    workdir: Path, n: int, *, receiver_process: bool = False, database: str | None = None
) -> Latency:
    """`receiver_process`: the receiver runs in its own process (as an agent's endpoint would),
    not in a thread of this one, where it shares the GIL with the emulator and the audit poll."""
    received_at: dict[str, float] = {}
    arrived = threading.Condition()

    def decide(body: dict[str, object]) -> dict[str, object] | None:
        now = time.monotonic()
        events = body.get("events")
        with arrived:
            for event in events if isinstance(events, list) else []:
                received_at[str(event["id"])] = now
            arrived.notify_all()
        return None

    state = workdir / ("latency-process" if receiver_process else "latency")
    recorded: list[float] = []
    received: list[float] = []
    with contextlib.ExitStack() as stack:
        emu = stack.enter_context(
            NtfyEmulator(EmulatorConfig(keepalive_interval=1.0, manager_interval=None)).running()
        )
        rx_db = workdir / f"rx-latency{'-process' if receiver_process else ''}.sqlite3"
        if receiver_process:
            url = stack.enter_context(stamping_receiver(rx_db, received_at, arrived))
        else:
            url = stack.enter_context(receiver.running(rx_db, decide=decide)).url
        env = daemon_env(emu.url, state, relay_url=url, cadence_debounce="0s")
        if database is not None:  # issue 23: the store on PostgreSQL
            env["NTFY_INTAKE_STATE_DATABASE"] = database
        stack.enter_context(daemon(env, workdir / "latency.log"))
        emu.wait_for_subscribers(1, timeout=30)
        counter = AuditCounter(state / "audit")
        writes = stack.enter_context(contextlib.closing(FileWrites(state / "audit")))

        def one(i: int) -> tuple[float, float]:
            began, seen, got = probe(
                emu, counter, arrived, received_at, i, "latency probe", writes=writes
            )
            return seen - began, got - began

        sent, startup = warm_up(counter, lambda i: one(i)[1])
        for i in range(sent, sent + n):
            took_to_record, took_to_receive = one(i)
            recorded.append(took_to_record)
            received.append(took_to_receive)
        # The receiver's own share: a plain POST of the same shape, from here, until `decide`.
        post_only: list[float] = []
        with httpx.Client(timeout=10) as client:
            for i in range(WARMUP + n):
                key = f"plainlat_{i:07d}"
                payload = body(key, i)
                payload["events"][0]["id"] = f"plainlat{i:04d}"  # type: ignore[index]
                event_id = f"plainlat{i:04d}"
                began = time.monotonic()
                client.post(url, json=payload, headers={"Idempotency-Key": key})
                with arrived:
                    arrived.wait_for(lambda e=event_id: e in received_at, STEP_TIMEOUT_S)
                    got = received_at[event_id]
                if i >= WARMUP:
                    post_only.append(got - began)
    floor_dir = workdir / ("floor-process" if receiver_process else "floor")
    floor_dir.mkdir(exist_ok=True)
    return Latency(recorded, received, durable_floor(floor_dir, n), post_only, startup)


def warm_up(counter: AuditCounter, step: Callable[[int], float]) -> tuple[int, list[float]]:
    """`step(i)` (one probe, returning its publish -> received) WARMUP times, then on until the
    start-up overlap backfill is recorded: the daemon polls `cache_settle` (2 s) after its
    stream opened and re-reads what was published since, a few hundred duplicates here, a
    start-up transient whose events are not the live steady state the p99 bound is about (the
    three worst of every run before, each queued behind it). Returns how many probes it sent
    and the times of those after the first WARMUP (the cold start), for the start-up row."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    times: list[float] = []
    while len(times) < WARMUP or counter.backfills == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("no start-up backfill recorded")
        times.append(step(len(times)))
    return len(times), times[WARMUP:]


def latency_rows(
    result: Latency, where: str = "", *, p99_target: float = TARGET_P99_S
) -> list[Row]:
    rec50, rec99 = percentile(result.recorded, 50), percentile(result.recorded, 99)
    rx50, rx99 = percentile(result.received, 50), percentile(result.received, 99)
    fl50, fl99 = percentile(result.floor, 50), percentile(result.floor, 99)
    n = len(result.recorded)
    po50, po99 = percentile(result.post_only, 50), percentile(result.post_only, 99)
    share = [rx - rec for rx, rec in zip(result.received, result.recorded, strict=True)]
    sh50, sh99 = percentile(share, 50), percentile(share, 99)
    tag = f" ({where})" if where else ""
    return [
        Row(
            f"live: publish -> received by receiver{tag}, p50 (n={n})",
            ms(rx50),
            f"durable-write floor p50 {ms(fl50)}",
            ratio(rx50, fl50),
            "<= 3 ms",
            met(rx50 <= TARGET_P50_S),
        ),
        Row(
            f"live: publish -> received by receiver{tag}, p99 (n={n})",
            ms(rx99),
            f"durable-write floor p99 {ms(fl99)}",
            ratio(rx99, fl99),
            f"<= {p99_target * 1000:g} ms",
            met(rx99 <= p99_target),
        ),
        Row(
            "live: publish -> durably recorded, p50 / p99",
            f"{ms(rec50)} / {ms(rec99)}",
            f"floor {ms(fl50)} / {ms(fl99)}",
            ratio(rec50, fl50),
        ),
        Row(
            "  relay's share: durably recorded -> received, p50 / p99 (per event)",
            f"{ms(sh50)} / {ms(sh99)}",
            "",
            "",
        ),
        Row(
            f"  start-up: the {len(result.startup)} events after the first {WARMUP}, until the"
            " overlap backfill is recorded, p50 / max",
            f"{ms(percentile(result.startup, 50))} / {ms(max(result.startup))}"
            if result.startup
            else "",
            "",
            "",
        ),
        Row(
            "  receiver's share: plain POST from the bench -> decide, p50 / p99",
            f"{ms(po50)} / {ms(po99)}",
            "",
            ratio(rx50 - rec50, po50) if rx50 > rec50 else "",
        ),
    ]


# -- relay throughput -------------------------------------------------------------------------------


@contextlib.contextmanager
def receiver_process(db_path: Path, log: Path) -> Iterator[tuple[str, int]]:
    """The reference receiver as its own process: (triage URL, pid)."""
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ntfy_intake",
                "receiver",
                "--port",
                str(port),
                "--db",
                str(db_path),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            base = f"http://127.0.0.1:{port}"

            def up() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
                return False

            wait_for(up, 30, "the receiver", interval=0.05)
            yield f"{base}/triage", proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def receipts_span(db_path: Path, prefix: str) -> tuple[int, float]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        count, first, last = conn.execute(
            "SELECT count(*), min(received_at), max(received_at) FROM receipts"
            " WHERE delivery_key LIKE ?",
            (prefix + "%",),
        ).fetchone()
    finally:
        conn.close()
    return int(count), (last - first) if count else 0.0


def receipt_count(db_path: Path) -> int:
    if not db_path.exists():
        return 0
    try:
        return receipts_span(db_path, "")[0]
    except sqlite3.Error:
        return 0


def body(key: str, i: int) -> dict[str, object]:
    return {
        "schema": receiver.SCHEMA,
        "delivery_key": key,
        "reason": "new_incident",
        "incident": {"key": f"alerts:relay {i}", "severity": 3, "status": "firing", "version": 1},
        "events": [
            {
                "id": f"plain{i:07d}",
                "topic": "alerts",
                "time": 1_764_470_000 + i,
                "title": f"relay {i}",
                "message": f"relay throughput #{i}",
                "priority": 3,
                "tags": [],
            }
        ],
        "untrusted_fields": ["events[].title", "events[].message", "events[].tags"],
    }


@dataclass
class Throughput:
    requests: int
    daemon_s: float
    plain_s: float
    plain_concurrent_s: float
    daemon_cpu_per: float = 0.0  # CPU seconds per delivery, daemon process
    receiver_cpu_per: float = 0.0  # the same, receiver process

    @property
    def rate(self) -> float:
        return self.requests / self.daemon_s

    @property
    def plain_rate(self) -> float:
        return self.requests / self.plain_s

    @property
    def plain_concurrent_rate(self) -> float:
        return self.requests / self.plain_concurrent_s


async def plain_concurrent(url: str, n: int, concurrency: int) -> float:
    """The same POSTs over `concurrency` connections at once: what the receiver can take."""
    async with httpx.AsyncClient(timeout=10) as client:
        queue = list(range(n))

        async def worker() -> None:
            while queue:
                i = queue.pop()
                key = f"conc_{i:07d}"
                response = await client.post(
                    url, json=body(key, i), headers={"Idempotency-Key": key}
                )
                response.raise_for_status()

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - began


def relay_throughput(workdir: Path, n: int) -> Throughput:
    rx_db = workdir / "rx-relay.sqlite3"
    state = workdir / "relay"
    with (
        NtfyEmulator(
            EmulatorConfig(keepalive_interval=1.0, manager_interval=None)
        ).running() as emu,
        receiver_process(rx_db, workdir / "receiver.log") as (url, rx_pid),
    ):
        for i in range(n):
            emu.publish("alerts", f"relay throughput #{i}", title=f"relay {i}")
        env = daemon_env(
            emu.url, state, relay_url=url, cadence_debounce="0s", ntfy_first_start="all"
        )
        with daemon(env, workdir / "relay.log") as proc:
            deadline = time.monotonic() + 600

            # CPU of both processes from the first receipt seen to the last: per delivery.
            cpu: list[tuple[int, float, float]] = []

            def all_in() -> bool:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("daemon exited or relay did not finish in 600 s")
                count = receipt_count(rx_db)
                if count and (not cpu or count >= n):
                    cpu.append((count, proc_cpu_s(proc.pid), proc_cpu_s(rx_pid)))
                return count >= n

            wait_for(all_in, 600, "every triage request receipted", interval=0.05)
        count, daemon_span = receipts_span(rx_db, "")
        assert count == n, count
        with httpx.Client(timeout=10) as client:
            began = time.perf_counter()
            for i in range(n):
                key = f"plain_{i:07d}"
                response = client.post(url, json=body(key, i), headers={"Idempotency-Key": key})
                response.raise_for_status()
            plain_s = time.perf_counter() - began
        plain_concurrent_s = asyncio.run(plain_concurrent(url, n, PLAIN_CONCURRENCY))
    (n0, d0, r0), (n1, d1, r1) = cpu[0], cpu[-1]
    per = max(1, n1 - n0)
    return Throughput(n, daemon_span, plain_s, plain_concurrent_s, (d1 - d0) / per, (r1 - r0) / per)


NULL_RECEIVER = """
import asyncio, sys

async def handle(reader, writer):
    body = b'{"accepted":true}'
    answer = b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: %d\\r\\n\\r\\n%s"
    try:
        while True:
            head = await reader.readuntil(b"\\r\\n\\r\\n")
            length = 0
            for line in head.split(b"\\r\\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            writer.write(answer % (len(body), body))
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


def relay_own_ceiling(workdir: Path, n: int) -> float:
    """Deliveries/s to a receiver that stores nothing and answers 200 at once (its own process):
    what the relay itself can do. Span: the first to the last `delivery` audit record."""
    port = free_port()
    state = workdir / "relay-null"
    null = subprocess.Popen(
        [sys.executable, "-c", NULL_RECEIVER, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert null.stdout is not None
        if null.stdout.readline().strip() != "ready":
            raise RuntimeError("null receiver did not start")
        with NtfyEmulator(
            EmulatorConfig(keepalive_interval=1.0, manager_interval=None)
        ).running() as emu:
            for i in range(n):
                emu.publish("alerts", f"relay ceiling #{i}", title=f"ceiling {i}")
            env = daemon_env(
                emu.url,
                state,
                relay_url=f"http://127.0.0.1:{port}/triage",
                cadence_debounce="0s",
                ntfy_first_start="all",
            )
            stamps: list[str] = []
            with daemon(env, workdir / "relay-null.log") as proc:

                def all_delivered() -> bool:
                    if proc.poll() is not None:
                        raise RuntimeError("daemon exited during the relay")
                    stamps[:] = [
                        str(r["ts"])
                        for r in audit.read_records(state / "audit")
                        if r.get("kind") == "delivery" and r.get("result") == "delivered"
                    ]
                    return len(stamps) >= n

                wait_for(all_delivered, 600, "every request delivered", interval=0.1)
    finally:
        null.terminate()
        null.wait(10)
        if null.stdout is not None:
            null.stdout.close()
    times = sorted(datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() for t in stamps)
    return n / max(times[-1] - times[0], 1e-3)


def _null_receiver(port: int) -> subprocess.Popen[str]:
    null = subprocess.Popen(
        [sys.executable, "-c", NULL_RECEIVER, str(port)], stdout=subprocess.PIPE, text=True
    )
    assert null.stdout is not None
    if null.stdout.readline().strip() != "ready":
        raise RuntimeError("null receiver did not start")
    return null


@dataclass
class InProcess:
    target: str
    requests: int
    wall_s: float
    cpu_s: float  # this process, user+sys: the relay, its worker thread and sqlite

    @property
    def rate(self) -> float:
        return self.requests / self.wall_s


def relay_in_process(
    workdir: Path, n: int, target: str, profile: Path | None = None, concurrency: int = 4
) -> InProcess:
    """The relay alone in this process (its own event loop, worker thread and audit log, as the
    daemon wires them) against a receiver process: the reference receiver or the null one.
    `profile` writes a cProfile of the run there."""
    state = workdir / f"inproc-{target}"
    conn = dbmod.connect(state / "intake.sqlite3")
    migrations.apply(conn)
    with dbmod.write_txn(conn):
        for i in range(n):
            key = f"triage_inproc_{target}_{i:07d}"
            outbox.create(conn, key, f"alerts:inproc {i}", "new_incident", 0.0, float(i))
            conn.execute(
                "UPDATE outbox SET state = 'pending', payload = ? WHERE delivery_key = ?",
                (json.dumps(body(key, i), separators=(",", ":")), key),
            )
    log = audit.AuditLog(state / "audit", time.time)
    # The daemon's logging (JSON lines, one `relay.delivered` per delivery), into a file.
    log_file = (workdir / f"inproc-{target}.log").open("w")
    stdout, sys.stdout = sys.stdout, log_file
    try:
        logs.configure(json_output=True)
    finally:
        sys.stdout = stdout
    policy = cadence.Policy(debounce=0.0)
    with contextlib.ExitStack() as stack:
        if target == "null":
            port = free_port()
            null = _null_receiver(port)
            stack.callback(null.wait, 10)
            stack.callback(null.terminate)
            url = f"http://127.0.0.1:{port}/triage"
        else:
            url, _ = stack.enter_context(
                receiver_process(workdir / "rx-inproc.sqlite3", workdir / "receiver.log")
            )

        async def scenario() -> tuple[float, float]:
            lock = asyncio.Lock()

            async def run_db(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
                async with lock:
                    return await asyncio.to_thread(fn, *args, **kwargs)

            async def flush() -> bool:
                await run_db(audit.flush, conn, log)
                return True

            stop = asyncio.Event()
            async with httpx.AsyncClient() as client:
                r = relay.Relay(
                    conn,
                    client,
                    run_db=run_db,
                    owner_queue=OwnerQueue(policy, cadence.CadenceState.empty(policy)),
                    url=url,
                    timeout=10.0,
                    max_attempts=8,
                    clock=time.time,
                    flush_audit=flush,
                    concurrency=concurrency,
                )
                began, cpu = time.perf_counter(), time.process_time()
                task = asyncio.create_task(r.run(stop))
                while r.stats.delivered < n:
                    if task.done():
                        task.result()
                        raise RuntimeError("relay stopped early")
                    await asyncio.sleep(0.005)
                wall, used = time.perf_counter() - began, time.process_time() - cpu
                stop.set()
                r.wakeup.set()
                await task
            return wall, used

        if profile is not None:
            profiler = cProfile.Profile()
            wall, used = profiler.runcall(asyncio.run, scenario())
            profiler.dump_stats(profile)
        else:
            wall, used = asyncio.run(scenario())
    conn.close()
    log_file.close()
    return InProcess(target, n, wall, used)


def plain_null(n: int, concurrency: int) -> InProcess:
    """httpx alone: `concurrency` workers POSTing n requests of the same shape to a null
    receiver process with one AsyncClient, no database, no audit. What the HTTP client costs."""
    port = free_port()
    null = _null_receiver(port)
    try:
        url = f"http://127.0.0.1:{port}/triage"

        async def scenario() -> tuple[float, float]:
            async with httpx.AsyncClient(timeout=10) as client:
                queue = list(range(n))

                async def worker() -> None:
                    while queue:
                        i = queue.pop()
                        key = f"plainnull_{i:07d}"
                        content = json.dumps(body(key, i), separators=(",", ":")).encode()
                        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
                        response = await client.post(url, content=content, headers=headers)
                        response.raise_for_status()

                began, cpu = time.perf_counter(), time.process_time()
                await asyncio.gather(*(worker() for _ in range(concurrency)))
                return time.perf_counter() - began, time.process_time() - cpu

        wall, used = asyncio.run(scenario())
    finally:
        null.terminate()
        null.wait(10)
        if null.stdout is not None:
            null.stdout.close()
    return InProcess("plain httpx ->", n, wall, used)


POST_ROUNDS = 5


def post_cost(n: int, concurrency: int = 4, rounds: int = POST_ROUNDS) -> dict[str, list[float]]:
    """CPU seconds per POST of this process, the relay's client (`KeepAlivePoster`) against
    httpx's AsyncClient, to a null receiver process: `concurrency` workers, `n` POSTs of the
    relay's shape per round, the two alternating round by round so both see the same machine."""
    port = free_port()
    null = _null_receiver(port)
    url = f"http://127.0.0.1:{port}/triage"
    costs: dict[str, list[float]] = {"relay client": [], "httpx": []}
    payloads = [json.dumps(body(f"triage_post_{i:07d}", i)).encode() for i in range(n)]
    fixed = {"Content-Type": "application/json", "User-Agent": f"ntfy-intake/{__version__}"}

    async def scenario(client: str) -> float:
        timeouts = httpx.Timeout(10)
        poster = http_post.KeepAlivePoster(url, timeouts=timeouts, max_reply=relay.MAX_REPLY_BYTES)
        plain = httpx.AsyncClient(timeout=timeouts)
        queue: list[int] = []

        async def worker() -> None:
            while queue:
                i = queue.pop()
                headers = {"Idempotency-Key": f"triage_post_{i:07d}", **fixed}
                if client == "httpx":
                    status = (
                        await plain.post(url, content=payloads[i], headers=headers)
                    ).status_code
                else:
                    status, _, _ = await poster.post(payloads[i], headers)
                assert status == 200, status

        queue[:] = range(min(n, 200))  # warm: connections open, caches filled
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        queue[:] = range(n)
        cpu = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        used = time.process_time() - cpu
        await poster.aclose()
        await plain.aclose()
        return used / n

    try:
        for _ in range(rounds):
            for client, spent in costs.items():
                spent.append(asyncio.run(scenario(client)))
    finally:
        null.terminate()
        null.wait(10)
        if null.stdout is not None:
            null.stdout.close()
    return costs


def post_rows(n: int, costs: dict[str, list[float]]) -> list[Row]:
    ours, theirs = sorted(costs["relay client"]), sorted(costs["httpx"])
    mid_ours, mid_theirs = ours[len(ours) // 2], theirs[len(theirs) // 2]
    return [
        Row(
            f"  one relay POST, CPU (median of {len(ours)} rounds of {n:,}, 4 at once)",
            f"{mid_ours * 1e6:.0f} us (range {ours[0] * 1e6:.0f}-{ours[-1] * 1e6:.0f})",
            f"httpx AsyncClient, same run: {mid_theirs * 1e6:.0f} us "
            f"(range {theirs[0] * 1e6:.0f}-{theirs[-1] * 1e6:.0f})",
            ratio(mid_ours, mid_theirs),
        )
    ]


def in_process_rows(result: InProcess, plain: InProcess | None = None) -> list[Row]:
    reference = f"CPU here {result.cpu_s / result.requests * 1e6:,.0f} us/delivery"
    if plain is not None:
        reference += (
            f"; plain httpx {plain.rate:,.0f}/s, "
            f"{plain.cpu_s / plain.requests * 1e6:,.0f} us/request"
        )
    return [
        Row(
            f"  relay in-process -> {result.target} receiver process, {result.requests:,} requests",
            f"{result.rate:,.0f} deliveries/s",
            reference,
            ratio(result.rate, plain.rate) if plain is not None else "",
        )
    ]


def ceiling_rows(n: int, rate: float) -> list[Row]:
    return [
        Row(
            f"  relay's own ceiling: {n:,} requests to a null receiver (answers 200, stores nothing)",
            f"{rate:,.0f} deliveries/s",
            "",
            "",
            f">= {TARGET_RELAY_RATE:,.0f}/s",
            met(rate >= TARGET_RELAY_RATE),
        )
    ]


def throughput_rows(result: Throughput) -> list[Row]:
    return [
        Row(
            f"relay throughput, {result.requests:,} triage requests (concurrency "
            f"{relay.DEFAULT_CONCURRENCY})",
            f"{result.rate:,.0f} deliveries/s",
            f"plain httpx POST loop {result.plain_rate:,.0f}/s",
            ratio(result.rate, result.plain_rate),
            f">= {TARGET_RELAY_RATE:,.0f}/s",
            met(result.rate >= TARGET_RELAY_RATE),
        ),
        Row(
            "  CPU per delivery (user+sys): daemon / receiver process",
            f"{result.daemon_cpu_per * 1e6:,.0f} us / {result.receiver_cpu_per * 1e6:,.0f} us",
            f"2 cores' ceiling {2 / (result.daemon_cpu_per + result.receiver_cpu_per):,.0f}/s"
            if result.daemon_cpu_per + result.receiver_cpu_per > 0
            else "",
            "",
        ),
        Row(
            "  receiver ceiling: plain httpx, same concurrency",
            f"{result.plain_concurrent_rate:,.0f} POSTs/s",
            "",
            ratio(result.rate, result.plain_concurrent_rate),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument(
        "--only",
        choices=[
            "latency",
            "latency-rxproc",
            "relay",
            "ceiling",
            "post",
            "inproc-null",
            "inproc-receiver",
        ],
        action="append",
        default=None,
    )
    parser.add_argument("--profile", type=Path, default=None, help="cProfile the in-process run")
    parser.add_argument("--concurrency", type=int, default=relay.DEFAULT_CONCURRENCY)
    args = parser.parse_args()
    parts = args.only or ["latency", "relay", "ceiling", "post"]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-latency-", dir=args.dir) as tmp:
        if "latency" in parts:
            rows += latency_rows(live_latency(Path(tmp), args.events))
        if "latency-rxproc" in parts:
            result = live_latency(Path(tmp), args.events, receiver_process=True)
            rows += latency_rows(result, "receiver in its own process")
        if "relay" in parts:
            rows += throughput_rows(relay_throughput(Path(tmp), args.requests))
        if "ceiling" in parts:
            rows += ceiling_rows(args.requests, relay_own_ceiling(Path(tmp), args.requests))
        if "post" in parts:
            rows += post_rows(args.requests, post_cost(args.requests))
        for target in ("null", "receiver"):
            if f"inproc-{target}" in parts:
                result = relay_in_process(
                    Path(tmp), args.requests, target, args.profile, args.concurrency
                )
                plain = plain_null(args.requests, args.concurrency) if target == "null" else None
                rows += in_process_rows(result, plain)
    print(render(rows))


if __name__ == "__main__":
    main()
