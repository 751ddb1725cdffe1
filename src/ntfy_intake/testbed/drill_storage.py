"""`ntfy-intake drill --faults storage`: storage and clock faults under a live stream, same verdict.

The real daemon runs as a subprocess against the bundled emulator and the reference receiver, as
in the kill drill (drill.py), while the drill works through a shuffled plan of `--rounds` faults
of each kind:

- `disk_full`: the state directory is a small tmpfs of its own (root mounts it; without the right
  to mount, this kind is skipped and says why); the drill fills it to ENOSPC under both the
  database and the audit directory, holds it full while events arrive, then frees it. A daemon
  that latched the audit log is restarted (the latch notice advises it);
- `rlimit_fsize`: the daemon's RLIMIT_FSIZE (prlimit) is set just above its audit file's size,
  so writes fail with EFBIG (not ENOSPC: CPython ignores SIGXFSZ); then lifted;
- `audit_deleted`: an audit file the daemon holds open is deleted under it;
- `db_deleted`: between two runs (SIGTERM, delete intake.sqlite3 and its WAL, start): the daemon
  must rebuild from the audit log;
- `write_lock`: another process holds the database's write lock for 2-12 s (past the 10 s busy
  timeout at times);
- `clock_jump`: the daemon's clock jumps 8 days ahead or back (an injected offset, the machine's
  clock untouched), sometimes across a restart, then returns.

With `--database DSN` the store is PostgreSQL (a schema of the drill's own, drill_store.py):
`disk_full` and `db_deleted` are SQLite-file faults and are skipped, saying so; `write_lock` holds
the engine's advisory write lock; and two more kinds run mid-stream:

- `pg_terminate`: pg_terminate_backend of the daemon's sessions (once or twice in a row);
- `pg_restart`: an immediate restart of the server (`--pg-data DIR`, pg_ctl -m immediate, as the
  data dir's owner); without `--pg-data` it is skipped.

Each fault records what the daemon did about it (from its log). The verdict is the kill drill's
(drill_report.py): 0 lost, 0 doubled, every triage request receipted once as an effect.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, TextIO

from ntfy_intake.store import audit, db
from ntfy_intake.testbed import drill, drill_parts, drill_store
from ntfy_intake.testbed.drill_report import Tally, check, render
from ntfy_intake.testbed.full_disk import fill, small_filesystem

KINDS = ("disk_full", "rlimit_fsize", "audit_deleted", "db_deleted", "write_lock", "clock_jump")
PG_KINDS = ("pg_terminate", "pg_restart")  # with --database only
SQLITE_ONLY = {
    "disk_full": "SQLite-file fault (tmpfs under the database): the store is PostgreSQL",
    "db_deleted": "SQLite-file fault (intake.sqlite3 deleted): the store is PostgreSQL",
}
TMPFS_SIZE = (
    "512m"  # a cap, not a fault: the state of a long run must fit; the fault fills the rest
)
JUMP_S = 8 * 86400.0
CLOCK_ENV = "NTFY_INTAKE_TEST_CLOCK_OFFSET_FILE"
LOCK_SECONDS = (2.0, 12.0)

# What the daemon logs when it meets each fault (counted in its log, before and after).
EFFECTS = {
    "storage.waiting": "waited on storage",
    "audit.latched": "audit latched",
    "audit.file_replaced": "audit file reopened",
    "database.rebuilt_from_audit": "rebuilt from audit",
    "clock.jump": "clock jump noticed",
}

HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


class PipedDaemon(drill_parts.DaemonProcess):
    """The daemon with its output through a pipe the drill copies to daemon.log: RLIMIT_FSIZE
    limits regular files only, so the limit falls on the state files, not on the log."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        super().__init__(env, log_path)
        self._copier: threading.Thread | None = None
        self._log_lock = threading.Lock()

    def start(self, crash_at: str | None = None) -> float:
        assert not self.alive(), "a daemon is already running"
        self._join_copier()
        self.starts += 1
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._write(f"--- drill: start #{self.starts} (storage faults) ---\n".encode())
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ntfy_intake", "run"],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        stream = self.proc.stdout
        assert stream is not None
        self._copier = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._copier.start()
        return started

    def _copy(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._write(line)
        stream.close()

    def _write(self, data: bytes) -> None:
        with self._log_lock:
            if self._log is not None:
                self._log.write(data)
                self._log.flush()

    def _join_copier(self) -> None:
        if self._copier is not None:
            self._copier.join(10)
            self._copier = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.kill9()
        self._join_copier()
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None


class StorageDrill(drill.Drill):
    def __init__(
        self,
        *,
        rounds: int,
        kinds: tuple[str, ...],
        fs_problem: str | None,
        pg_data: Path | None = None,
        **kw: object,
    ) -> None:
        super().__init__(kills=0, **kw)  # type: ignore[arg-type]
        self.rounds = rounds
        self.kinds = kinds
        self.fs_problem = fs_problem
        self.pg_data = pg_data
        self.clock_file = self.state_dir.parent / "clock-offset"
        self.clock_file.write_text("0")
        env = {
            **self._daemon_env(),
            CLOCK_ENV: str(self.clock_file),
            "NTFY_INTAKE_HTTP_LISTEN": "127.0.0.1:0",  # never collide with a real daemon's port
        }
        self.daemon = PipedDaemon(env, self.state_dir.parent / "daemon.log")
        self.done: Counter[str] = Counter()
        self.effects: dict[str, Counter[str]] = {kind: Counter() for kind in (*KINDS, *PG_KINDS)}
        self.skipped: dict[str, str] = {}
        self.tally.kills_requested = 0

    # -- the plan ----------------------------------------------------------------------------------

    def run(self) -> Tally:
        self._started_at = time.monotonic()
        if self.database:
            self.skipped.update(SQLITE_ONLY)
            if self.pg_data is None:
                self.skipped["pg_restart"] = "needs --pg-data DIR (the server's data dir)"
        else:
            self.skipped.update(dict.fromkeys(PG_KINDS, "needs --database (PostgreSQL)"))
        if self.fs_problem is not None:
            self.skipped.setdefault("disk_full", self.fs_problem)
        plan = [kind for kind in self.kinds for _ in range(self.rounds) if kind not in self.skipped]
        self.rng.shuffle(plan)
        try:
            self.daemon.start()
            self._first_start()
            for index, kind in enumerate(plan):
                self.say(f"fault {index + 1}/{len(plan)}: {kind}")
                self._ensure_running()
                before = self._log_counts()
                getattr(self, f"_{kind}")()
                self.done[kind] += 1
                time.sleep(0.3)  # a write that failed during the fault logs it just after
                after = self._log_counts()
                for marker, label in EFFECTS.items():
                    if after[marker] > before[marker]:
                        self.effects[kind][label] += 1
                self._settle(kind, latched=after["audit.latched"] > before["audit.latched"])
            self._final()
        finally:
            self.clock_file.write_text("0")
            self.publisher.stop()
            self.daemon.close()
        return self._closing_tally()

    def _ensure_running(self) -> None:
        if not self.daemon.alive():
            self._unexpected_exit(f"start #{self.daemon.starts} (between faults)")
            self.daemon.start()
        self._wait_running()

    def _settle(self, kind: str, *, latched: bool) -> None:
        """After a fault: caught up with the live stream again (a latched daemon is restarted
        first: its latch notice advises exactly that)."""
        if latched or self._latched():
            self._restart(f"after {kind} (latched)")
        published, since = self.ledger.count(), time.monotonic()
        state, took = self._catch_up(published, since)
        if state == "caught" and took is not None:
            self.tally.recovery.append(took)
        elif state == "died":
            self._unexpected_exit(f"start #{self.daemon.starts} (after {kind})")
        elif state == "timeout":
            self.tally.stalls.append(
                f"no catch-up within {drill_parts.STALL_BOUND_S:g} s after {kind}"
            )

    def _latched(self) -> bool:
        row = self.store.row("SELECT value FROM kv WHERE name = 'health'")
        return bool(row) and '"latch": true' in str(row[0] if row else "")

    def _restart(self, what: str) -> None:
        self._wait_running()
        self._sigterm(what)
        self.daemon.start()
        self._wait_running()

    def _log_counts(self) -> Counter[str]:
        try:
            text = self.daemon.log_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return Counter()
        return Counter({marker: text.count(marker) for marker in EFFECTS})

    def _hold(self, low: float = 0.5, high: float = 2.0) -> None:
        time.sleep(self.rng.uniform(low, high))

    # -- the faults --------------------------------------------------------------------------------

    def _disk_full(self) -> None:
        filler = self.state_dir / "filler"
        try:
            fill(filler)
            self._hold()
        finally:
            filler.unlink(missing_ok=True)

    def _rlimit_fsize(self) -> None:
        pid = self.daemon.pid
        files = audit.log_files(self.state_dir / "audit")
        if pid is None or not files:
            return
        limit = files[-1].stat().st_size + 256
        unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            self._hold()
        except (ProcessLookupError, PermissionError) as exc:
            self.skipped.setdefault("rlimit_fsize", f"prlimit refused: {exc}")
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                resource.prlimit(pid, resource.RLIMIT_FSIZE, unlimited)

    def _audit_deleted(self) -> None:
        """Delete an audit file the daemon holds open (one it has not opened yet would be an
        operator deleting history, which nothing could bring back)."""
        pid = self.daemon.pid
        deadline = time.monotonic() + 5
        while pid is not None and time.monotonic() < deadline:
            held = [p for p in _open_files(pid) if p.parent == self.state_dir / "audit"]
            if held:
                held[0].unlink(missing_ok=True)
                self._hold()
                return
            time.sleep(0.05)

    def _db_deleted(self) -> None:
        self._wait_running()
        self._sigterm("before deleting the database")
        for suffix in ("", "-wal", "-shm"):
            (self.state_dir / f"intake.sqlite3{suffix}").unlink(missing_ok=True)
        self.daemon.start()
        self._wait_running()

    def _write_lock(self) -> None:
        seconds = self.rng.uniform(*LOCK_SECONDS)
        if self.database:
            drill_store.hold_writer_lock(self.database, seconds)
            return
        holder = subprocess.Popen(  # noqa: S603 - this interpreter, our own code
            [sys.executable, "-c", HOLD_LOCK, str(self.state_dir / "intake.sqlite3"), str(seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert holder.stdout is not None
            holder.stdout.readline()
            holder.wait(seconds + 60)
        finally:
            if holder.poll() is None:
                os.kill(holder.pid, 9)
            holder.wait(10)
            if holder.stdout is not None:
                holder.stdout.close()

    def _clock_jump(self) -> None:
        jump = JUMP_S if self.done["clock_jump"] % 2 == 0 else -JUMP_S
        self.clock_file.write_text(str(jump))
        try:
            self._hold(1.0, 2.5)
            if self.done["clock_jump"] % 4 in (1, 2):  # now and then across a restart
                self._restart("while the clock is jumped")
                self._hold(0.5, 1.0)
        finally:
            self.clock_file.write_text("0")

    def _pg_terminate(self) -> None:
        """End the daemon's sessions mid-stream, now and then twice in a row."""
        for _ in range(self.rng.choice((1, 1, 2))):
            self.effects["pg_terminate"]["sessions ended"] += drill_store.terminate(
                str(self.database), self.daemon.pid
            )
            self._hold(0.2, 1.5)

    def _pg_restart(self) -> None:
        assert self.pg_data is not None
        began = time.monotonic()
        problem = drill_store.restart(self.pg_data)
        if problem is not None:
            self.tally.stalls.append(f"PostgreSQL restart failed: {problem}")
            return
        self.effects["pg_restart"][f"server back in {time.monotonic() - began:.1f} s"] += 1
        self._hold()

    # -- the table ---------------------------------------------------------------------------------

    def _summarise_faults(self) -> None:
        for kind in self.kinds:
            label = f"storage fault: {kind}"
            if kind in self.skipped and not self.done[kind]:
                self.tally.faults[label] = f"skipped: {self.skipped[kind]}"
                continue
            seen = ", ".join(f"{what} {n}" for what, n in sorted(self.effects[kind].items()))
            self.tally.faults[label] = f"{self.done[kind]}x" + (f" ({seen})" if seen else "")
        self.emu.faults.clear() if self.emu is not None else None


def _open_files(pid: int) -> list[Path]:
    found = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if not target.endswith(" (deleted)"):
                    found.append(Path(target))
    return found


def run(
    *,
    rounds: int = 20,
    seed: int | None = None,
    kinds: tuple[str, ...] | None = None,
    keep: bool = False,
    database: str | None = None,
    pg_data: Path | None = None,
    out: TextIO = sys.stdout,
    progress: TextIO | None = sys.stderr,
    tmpfs: Callable[[Path, str], contextlib.AbstractContextManager[str | None]] = small_filesystem,
) -> int:
    """Run the storage drill; print the verdict table to `out`; 0 on PASS, 1 on FAIL."""
    if kinds is None:
        kinds = (*KINDS, *PG_KINDS) if database else KINDS
    unknown = sorted(set(kinds) - set(KINDS) - set(PG_KINDS))
    if unknown or rounds < 1:
        raise ValueError(f"unknown fault kinds {unknown}" if unknown else "rounds must be >= 1")
    if seed is None:
        seed = random.SystemRandom().randrange(1, 1_000_000)
    with contextlib.ExitStack() as stack:
        workdir = stack.enter_context(drill._workdir(keep))
        schema_dsn = label = None
        if database is not None:
            schema, schema_dsn = stack.enter_context(drill_store.own_schema(database))
            label = f"PostgreSQL {db.Dsn(database)} schema {schema}"
            fs_problem: str | None = SQLITE_ONLY["disk_full"]  # no tmpfs: nothing to fill
        else:
            fs_problem = stack.enter_context(tmpfs(workdir / "state", TMPFS_SIZE))
        receiver_server = drill_parts.ReceiverServer(workdir / "receiver.sqlite3")
        receiver_server.start()
        stack.callback(receiver_server.stop)
        emu = stack.enter_context(drill_parts.drill_emulator().running())
        storage_drill = StorageDrill(
            rounds=rounds,
            kinds=kinds,
            fs_problem=fs_problem,
            pg_data=pg_data,
            database=schema_dsn,
            seed=seed,
            duration=None,
            target=drill.Target(emu.url, drill_parts.EMULATOR_TOPICS, None, emu),
            workdir=workdir,
            receiver_server=receiver_server,
            send=drill_parts.emulator_sender(emu),
            pace=drill_parts.EMULATOR_PACE,
            progress=progress,
        )
        stack.callback(storage_drill.store.close)
        if label is not None:
            storage_drill.tally.store = label
        tally = storage_drill.run()
        tally.kept = keep
        if keep and fs_problem is None:  # the tmpfs goes with the unmount: keep a copy
            shutil.copytree(storage_drill.state_dir, workdir / "state-kept")
            tally.state_dir = workdir / "state-kept"
        findings = check(
            storage_drill.ledger.ids(),
            storage_drill.state_dir,
            receiver_server.db_path,
            storage_drill.store,
        )
        passed = render(tally, findings, out)
        return 0 if passed else 1


def main(args: argparse.Namespace) -> int:
    """`ntfy-intake drill --faults storage`."""
    if args.rounds < 1:
        print("drill: --rounds must be at least 1", file=sys.stderr)
        return 2
    if args.pg_data is not None and args.database is None:
        print("drill: --pg-data needs --database", file=sys.stderr)
        return 2
    return run(
        rounds=args.rounds,
        seed=args.seed,
        keep=args.keep,
        database=args.database,
        pg_data=args.pg_data,
        out=sys.stdout,
        progress=sys.stderr,
    )
