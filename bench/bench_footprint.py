"""The Pi's footprint (issue 36, DESIGN.md section 14): idle wake-ups and CPU, and per live event
the bytes written and the CPU, each beside a reference measured the same way in the same run.

    uv run python bench/bench_footprint.py              # 60 s idle, 60 s at 5 events/s
    uv run python bench/bench_footprint.py --seconds 10 # shorter, to check the bench itself
    uv run python bench/bench_footprint.py --idle-only  # the idle figures alone

Idle: the daemon (shipped defaults, SQLite, the emulator's keepalive at 45 s like ntfy's) after
start-up settled; a thread wake-up is a context switch (voluntary + nonvoluntary, summed over
/proc/PID/task/*/status), CPU is utime + stime from /proc/PID/stat. The reference is a Python
process blocked in `select` on a socket: what the method itself reads for a process doing nothing.

Per event: 5 events/s published for the same time; `/proc/PID/io` write_bytes and CPU per event,
against the floor measured the same way in its own process: one SQLite INSERT (WAL, synchronous
FULL) plus one fsynced audit line append per event. A second reference, the contract's minimum,
does in one thread only what DESIGN.md sections 2 and 4 make every live event do: read it from
an emulator's stream (h11), decode it with the daemon's decoder, one transaction on the daemon's
schema (the id and the incident read; the inbox row, the outbox link, the incident and the
journal row written; COMMIT under synchronous FULL), then its audit line appended and fsynced. No
planner, cadence, cursor, health snapshot or event loop: what the contract itself costs in
Python, before anything a daemon adds to it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _common import Row, daemon, daemon_env, met, proc_cpu_s, ratio, render, wait_for
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

SETTLE_S = 5.0  # after the stream opened: the start-up overlap poll (cache_settle) and its writes
RATE = 5.0  # live events a second
TARGET_WAKEUPS_S = 2.0
TARGET_CPU_MS_MIN = 60.0
TARGET_WRITE_X = 2.0
TARGET_CPU_MS_EVENT = 1.0

# The reference idle process: blocked in select on a listening socket, forever.
_IDLE_REFERENCE = """
import select, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
sys.stdout.write("ready\\n"); sys.stdout.flush()
while True:
    select.select([s], [], [])
"""

# The floor: per line on stdin, one INSERT in WAL with synchronous FULL and one fsynced audit line.
_FLOOR = """
import json, os, sqlite3, sys
directory = sys.argv[1]
db = sqlite3.connect(os.path.join(directory, "floor.sqlite3"), isolation_level=None)
db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS inbox (id TEXT PRIMARY KEY, body TEXT)")
audit = open(os.path.join(directory, "floor-audit.jsonl"), "ab")
sys.stdout.write("ready\\n"); sys.stdout.flush()
for line in sys.stdin:
    event_id = line.strip()
    body = json.dumps({"id": event_id, "topic": "alerts", "message": "footprint probe " + event_id})
    db.execute("INSERT INTO inbox VALUES (?, ?)", (event_id, body))
    audit.write((json.dumps({"kind": "event", "event_id": event_id}) + "\\n").encode())
    audit.flush(); os.fsync(audit.fileno())
    sys.stdout.write("ok\\n"); sys.stdout.flush()
"""


# The contract's minimum (module doc): one process, one thread, per event what sections 2 and 4
# require and nothing else. Prints "ready" once the stream's `open` frame came.
_CONTRACT = """
import os, socket, sys, time
from pathlib import Path
import h11
from ntfy_intake.store import audit, db, incident_rows, migrations
from ntfy_intake.wire.frames import Message, Open, decode_line
port, directory = int(sys.argv[1]), Path(sys.argv[2])
conn = db.connect(str(directory / "contract.sqlite3"))
migrations.apply(conn)
log = audit.AuditLog(directory / "contract-audit", clock=time.time)
KEY, WINDOW = "alerts:footprint", "tri_contract"
conn.execute("BEGIN IMMEDIATE")
conn.execute(
    "INSERT INTO outbox(delivery_key, incident_key, reason, state, due_at, created_at)"
    " VALUES (?, ?, 'first', 'collecting', ?, ?)", (WINDOW, KEY, time.time() + 3600, time.time()))
conn.execute("COMMIT")
KNOWN = "SELECT event_id, raw_sha256 FROM inbox WHERE event_id = ?"
INCIDENT = "SELECT key, severity, status, events FROM incidents WHERE key = ?"
INBOX = (
    "INSERT INTO inbox(event_id, topic, time, expires, raw, raw_sha256, incident_key, severity,"
    " outcome, reason, delivery_key, received_at, event, sequence_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, 3, 'joined', 'debounce', ?, ?, 'message', NULL)")
LINK = "INSERT INTO outbox_events(delivery_key, event_id) VALUES (?, ?)"
JOURNAL = "INSERT INTO audit_journal(line) VALUES (?)"
topics = frozenset({"alerts", "backups"})
sock = socket.create_connection(("127.0.0.1", port))
http = h11.Connection(h11.CLIENT)
target = f"/alerts,backups/json?since={int(time.time())}"
host = f"127.0.0.1:{port}"
sock.sendall(http.send(h11.Request(method="GET", target=target, headers=[("Host", host)])))
sock.sendall(http.send(h11.EndOfMessage()))
buffer, events = b"", 0
while data := sock.recv(65536):
    http.receive_data(data)
    while isinstance(part := http.next_event(), h11.Response | h11.Data):
        if isinstance(part, h11.Data):
            buffer += bytes(part.data)
    *lines, buffer = buffer.split(b"\\n")
    for line in lines:
        frame = decode_line(line, topics)
        if isinstance(frame, Open):
            sys.stdout.write("ready\\n"); sys.stdout.flush()
        if not isinstance(frame, Message):
            continue
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(KNOWN, (frame.id,)).fetchall()
        seen = conn.execute(INCIDENT, (KEY,)).fetchone()
        events = (seen[3] if seen else 0) + 1
        conn.execute(INBOX, (frame.id, frame.topic, frame.time, frame.expires, frame.raw,
                             frame.raw_sha256, KEY, WINDOW, now))
        conn.execute(LINK, (WINDOW, frame.id))
        conn.execute(incident_rows.SAVE, (KEY, 3, "firing", frame.time, frame.id, frame.time,
                                          frame.time, events, 1))
        record = audit.encode({"ts": "2026-12-07T00:00:00.000Z", "kind": "event",
                               "event_id": frame.id, "incident": KEY, "severity": 3,
                               "status": "firing", "outcome": "joined", "reason": "debounce",
                               "delivery_key": WINDOW})
        seq = conn.execute(JOURNAL, (record,)).lastrowid
        conn.execute("COMMIT")
        log.append([audit.file_line(seq, record)], last_seq=seq)
"""


@dataclass
class Sample:
    """One process's counters at one moment."""

    wakeups: int
    cpu_s: float
    write_bytes: int

    @staticmethod
    def of(pid: int) -> Sample:
        return Sample(_wakeups(pid), proc_cpu_s(pid), _write_bytes(pid))

    def __sub__(self, other: Sample) -> Sample:
        return Sample(
            self.wakeups - other.wakeups,
            self.cpu_s - other.cpu_s,
            self.write_bytes - other.write_bytes,
        )


def _wakeups(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def _write_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


@dataclass
class Footprint:
    seconds: float
    idle: Sample
    reference: Sample
    events: int
    live: Sample
    floor: Sample
    contract: Sample
    threads: int


def measure_idle(pid: int, seconds: float) -> Sample:
    before = Sample.of(pid)
    time.sleep(seconds)
    return Sample.of(pid) - before


@contextlib.contextmanager
def _script(code: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the reference process did not start")
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def reference_idle(seconds: float) -> Sample:
    with _script(_IDLE_REFERENCE) as proc:
        time.sleep(0.5)
        return measure_idle(proc.pid, seconds)


def floor(directory: Path, events: int) -> Sample:
    """The floor at the same rate as the daemon's live phase, measured the same way."""
    with _script(_FLOOR, str(directory)) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        before = Sample.of(proc.pid)
        start = time.monotonic()
        for i in range(events):
            time.sleep(max(0.0, start + i / RATE - time.monotonic()))
            proc.stdin.write(f"floor-{i}\n")
            proc.stdin.flush()
            proc.stdout.readline()
        return Sample.of(proc.pid) - before


def contract_minimum(directory: Path, events: int) -> Sample:
    """The contract's minimum (module doc) on its own emulator, at the live phase's rate."""
    config = EmulatorConfig(keepalive_interval=45.0, manager_interval=None)
    with NtfyEmulator(config).running() as emu:
        port = emu.url.rsplit(":", 1)[1]
        with _script(_CONTRACT, port, str(directory)) as proc:
            before = Sample.of(proc.pid)
            _publish(emu, events)
            wait_for(
                lambda: _audit_events(directory / "contract-audit") >= events,
                30,
                "the contract's minimum recorded the live events",
                interval=0.05,
            )
            return Sample.of(proc.pid) - before


def _publish(emu: NtfyEmulator, events: int) -> None:
    start = time.monotonic()
    for i in range(events):
        time.sleep(max(0.0, start + i / RATE - time.monotonic()))
        emu.publish("alerts", f"footprint probe #{i}", title="footprint")


def _audit_events(audit_dir: Path) -> int:
    total = 0
    for path in audit_dir.glob("*"):
        with contextlib.suppress(OSError):
            total += path.read_bytes().count(b'"kind":"event"')
    return total


def measure(workdir: Path, seconds: float, *, idle_only: bool = False) -> Footprint:
    state = workdir / "footprint"
    config = EmulatorConfig(keepalive_interval=45.0, manager_interval=None)
    with NtfyEmulator(config).running() as emu:
        env = daemon_env(emu.url, state)
        # Shipped defaults: daemon_env's bench overrides (1 s keepalive, 300 ms reorder) removed.
        env.pop("NTFY_INTAKE_NTFY_KEEPALIVE_INTERVAL", None)
        env.pop("NTFY_INTAKE_NTFY_REORDER_WINDOW", None)
        with daemon(env, workdir / "footprint.log") as proc:
            emu.wait_for_subscribers(1, timeout=30)
            time.sleep(SETTLE_S)
            threads = len(list(Path(f"/proc/{proc.pid}/task").iterdir()))
            idle = measure_idle(proc.pid, seconds)
            events = 0 if idle_only else int(seconds * RATE)
            live = Sample(0, 0.0, 0)
            if events:
                audit_dir = state / "audit"
                already = _audit_events(audit_dir)
                before = Sample.of(proc.pid)
                _publish(emu, events)
                wait_for(
                    lambda: _audit_events(audit_dir) >= already + events,
                    30,
                    "the live events recorded",
                    interval=0.05,
                )
                # The cursor settle and the relay's sends after the last event belong to it.
                time.sleep(3.0)
                live = Sample.of(proc.pid) - before
    reference = reference_idle(seconds)
    floor_sample = floor(workdir, events) if events else Sample(0, 0.0, 0)
    contract = contract_minimum(workdir, events) if events else Sample(0, 0.0, 0)
    return Footprint(seconds, idle, reference, events, live, floor_sample, contract, threads)


def rows(fp: Footprint) -> list[Row]:
    per_s = fp.idle.wakeups / fp.seconds
    ref_per_s = fp.reference.wakeups / fp.seconds
    cpu_min = fp.idle.cpu_s * 1000 * 60 / fp.seconds
    ref_cpu_min = fp.reference.cpu_s * 1000 * 60 / fp.seconds
    out = [
        Row(
            f"idle wake-ups/s ({fp.threads} threads, keepalive 45 s)",
            f"{per_s:.2f}",
            f"select() process {ref_per_s:.2f}",
            ratio(per_s, ref_per_s),
            f"<= {TARGET_WAKEUPS_S:g}",
            met(per_s <= TARGET_WAKEUPS_S),
        ),
        Row(
            "idle CPU per minute",
            f"{cpu_min:.0f} ms",
            f"select() process {ref_cpu_min:.0f} ms",
            ratio(cpu_min, ref_cpu_min),
            f"<= {TARGET_CPU_MS_MIN:g} ms",
            met(cpu_min <= TARGET_CPU_MS_MIN),
        ),
    ]
    if fp.events:
        kib = fp.live.write_bytes / fp.events / 1024
        floor_kib = fp.floor.write_bytes / fp.events / 1024
        cpu = fp.live.cpu_s * 1000 / fp.events
        floor_cpu = fp.floor.cpu_s * 1000 / fp.events
        out += [
            Row(
                f"write_bytes per live event ({RATE:g}/s, {fp.events})",
                f"{kib:.1f} KiB",
                f"floor {floor_kib:.1f} KiB",
                ratio(kib, floor_kib),
                f"<= {TARGET_WRITE_X:g}x floor",
                met(floor_kib > 0 and kib / floor_kib <= TARGET_WRITE_X),
            ),
            Row(
                "CPU per live event",
                f"{cpu:.2f} ms",
                f"floor {floor_cpu:.2f} ms",
                ratio(cpu, floor_cpu),
                f"<= {TARGET_CPU_MS_EVENT:g} ms",
                met(cpu <= TARGET_CPU_MS_EVENT),
            ),
            Row(
                "  the contract's minimum: CPU per live event (one thread, no planner)",
                f"{fp.contract.cpu_s * 1000 / fp.events:.2f} ms",
                f"floor {floor_cpu:.2f} ms",
                ratio(fp.contract.cpu_s, fp.floor.cpu_s),
            ),
            Row(
                "  the contract's minimum: write_bytes per live event",
                f"{fp.contract.write_bytes / fp.events / 1024:.1f} KiB",
                f"floor {floor_kib:.1f} KiB",
                ratio(fp.contract.write_bytes, fp.floor.write_bytes),
            ),
            Row(
                "wake-ups per live event",
                f"{fp.live.wakeups / fp.events:.1f}",
                f"floor {fp.floor.wakeups / fp.events:.1f}",
                ratio(fp.live.wakeups, fp.floor.wakeups),
            ),
        ]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="each phase's length")
    parser.add_argument("--idle-only", action="store_true", help="skip the live phase")
    parser.add_argument("--dir", type=Path, default=None, help="work dir on the disk to measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ntfy-intake-footprint-", dir=args.dir) as tmp:
        fp = measure(Path(tmp), args.seconds, idle_only=args.idle_only)
    print(render(rows(fp)))
    print(f"\n(pid {os.getpid()}; {args.seconds:g} s per phase)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
