"""Local recovery, before READY: what a start does before it may subscribe.

Check the state directory and the ntfy URL (config errors, found before anything is opened),
take the state lock (one daemon per state directory), open and migrate the store, rebuild it
from the audit log when it is missing, rehydrate the cadence state, write the audit records
that reached the database but not the log, and find the cursor (a first start persists one at
once). A storage failure here names itself; a permanent one is a StartupError (exit 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from ntfy_intake.errors import DatabaseUnreachable, StartupError, StateLockedError
from ntfy_intake.flow.database import Database, StorageWaits
from ntfy_intake.flow.journal import Journal
from ntfy_intake.flow.pipeline import CountedOwnerQueue, append_triage_entry
from ntfy_intake.rules import cadence, notices
from ntfy_intake.rules.lease import Seen
from ntfy_intake.rules.outage import OutageClock
from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.settings import Settings
from ntfy_intake.settings.schema import is_dsn
from ntfy_intake.store import (
    audit,
    audit_files,
    db,
    migrations,
    outbox,
    rebuild,
    rehydrate,
    replay,
    storage,
)
from ntfy_intake.store.cursor import Cursor
from ntfy_intake.store.cursor import load as load_cursor
from ntfy_intake.store.cursor import save as save_cursor
from ntfy_intake.wire import http_stream

log = structlog.get_logger("ntfy_intake.daemon")


class StateLock:
    """One daemon per state directory: a second one would race the cursor and the audit log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return  # held already: a node's loop holds it across its terms (runtime/node.py)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateLockedError(
                f"another ntfy-intake daemon is using {self.path.parent} (lock {self.path.name})"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True, slots=True)
class Recovered:
    cursor: Cursor
    next_release: float | None  # when the next debounce window closes


def recover(
    settings: Settings,
    *,
    database: Database,
    journal: Journal,
    state_lock: StateLock,
    owner_queue: CountedOwnerQueue,
    clock: Callable[[], float],
    boot_id: str,
) -> Recovered:
    """Local recovery (module doc); on a storage failure the store and the lock are let go."""
    problem = storage.check_state_dir(settings.state.dir)
    if problem is not None:
        raise StartupError(problem)
    unusable = http_stream.url_problem(settings.ntfy.url)
    if unusable is not None:  # a config error, found before anything is opened
        raise StartupError(f"ntfy.url cannot be requested: {unusable}")
    try:
        return _recover(settings, database, journal, state_lock, owner_queue, clock, boot_id)
    except Exception as exc:
        # Whatever stops start-up (a storage fault, a schema from a newer version), the store
        # and the lock are let go: the caller may exit, or a test may start another daemon.
        with contextlib.suppress(Exception):
            database.close()
        state_lock.release()
        if not storage.is_storage_error(exc):
            raise
        raise storage.startup_error(exc, settings.state.store) from exc


def _recover(
    settings: Settings,
    database: Database,
    journal: Journal,
    state_lock: StateLock,
    owner_queue: CountedOwnerQueue,
    clock: Callable[[], float],
    boot_id: str,
) -> Recovered:
    problem = storage.check_audit_files(
        settings.state.audit_dir, audit.log_files(settings.state.audit_dir)[-1:]
    )
    if problem is not None:
        raise StartupError(problem)
    state_lock.acquire()
    if not is_dsn(settings.state.store):
        rebuild.remove_orphan_wal(settings.state.database_file)
    conn = database.open()
    migrations.apply(conn)
    rebuilt = _rebuild_from_audit(conn, settings, owner_queue.policy, clock)
    owner_queue.state = _rehydrate_cadence(conn, settings, owner_queue.policy, clock)
    if rebuilt is not None:
        journal.record_notice(notices.rebuilt_from_audit(str(rebuilt), boot_id))
    journal.recover()
    cursor = load_cursor(conn)
    if cursor is None:
        cursor = _first_cursor(settings, clock)
        save_cursor(conn, cursor, clock())
        log.info("intake.first_start", since=cursor.since)
    return Recovered(cursor, outbox.next_release_at(conn))


def _rebuild_from_audit(
    conn: db.Connection, settings: Settings, policy: cadence.Policy, clock: Callable[[], float]
) -> rebuild.Summary | None:
    """A missing or empty database beside an audit log is not a first start."""
    if not rebuild.is_empty(conn):
        return None
    summary = rebuild.from_audit(
        conn,
        settings.state.audit_dir,
        clock(),
        debounce=policy.debounce,
        relay_enabled=settings.relay.url is not None,
        feed_append=append_triage_entry,
    )
    if summary is not None:
        log.warning("database.rebuilt_from_audit", summary=str(summary))
    return summary


def _rehydrate_cadence(
    conn: db.Connection, settings: Settings, policy: cadence.Policy, clock: Callable[[], float]
) -> cadence.CadenceState:
    """Cadence state from the audit log (only the files the longest window needs), plus the
    records that reached SQLite but not yet the log: together, every recorded outcome."""
    started = time.monotonic()
    # Before ntfy answers, the newest server time recorded bounds a local clock that jumped
    # ahead while we were down: pruning by it keeps cooldowns and the day's cap (clock.py).
    now = clock()
    newest = replay.newest_server_time(conn)
    loaded = rehydrate.load(settings.state.audit_dir, policy, min(now, newest or now))
    state = loaded.state
    pending = 0
    folded_above = audit.flushed_seq(conn)
    if db.is_postgres(conn):
        # What this node's files hold, not the mark another node's flush moved (DESIGN.md
        # section 9): after a takeover the rows between them are in neither place it read.
        folded_above = audit_files.repair_tails(settings.state.audit_dir)
    for record in replay.unflushed_records(conn, folded_above):
        state.apply(record)
        pending += 1
    log.info(
        "cadence.rehydrated",
        files=loaded.files,
        records=loaded.records,
        unflushed=pending,
        ms=round((time.monotonic() - started) * 1000, 1),
    )
    return state


def _first_cursor(settings: Settings, clock: Callable[[], float]) -> Cursor:
    first = settings.ntfy.first_start
    if first.mode == "all":
        return Cursor.everything()
    history = first.seconds if first.mode == "history" else 0.0
    # Persisted at once: a crash before the first event resumes from this time, inclusive.
    return Cursor.at_time(int(clock() - history))


# A PostgreSQL server that does not answer at start-up is asked again after these waits.
STARTUP_RETRY_BASE = 0.5
STARTUP_RETRY_CAP = 15.0


async def when_reachable(
    recover: Callable[[], None],
    stop: asyncio.Event,
    waits: StorageWaits,
    degraded: dict[str, str],
    notifier: Notifier,
    boot_id: str,
) -> bool:
    """`recover()`; a PostgreSQL server that does not answer yet is waited out with backoff
    (degraded, said on systemd's STATUS=, one owner notice once it answers), never an exit: the
    database box may just be booting. False when stopped while waiting."""
    delay, since = STARTUP_RETRY_BASE, None
    while True:
        try:
            await asyncio.to_thread(recover)
        except DatabaseUnreachable as exc:
            if since is None:
                since = time.monotonic()
                waits.episodes += 1
                log.error("storage.waiting", fault=str(exc), transient=True, at="start-up")
            degraded["storage"] = f"{exc}; waiting"
            notifier.status(f"degraded: {exc}; waiting")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return False
            delay = min(delay * 2, STARTUP_RETRY_CAP)
            continue
        if since is not None:
            waited = time.monotonic() - since
            degraded.pop("storage", None)
            log.warning("storage.recovered", waited_s=round(waited, 1), at="start-up")
            waits.notices_owed.append(
                notices.storage_fault(
                    "unreachable",
                    f"the database did not answer at start-up for {waited:.0f} s",
                    f"{boot_id}:{waits.episodes}",
                )
            )
        return True


# How often the node's outage watch looks at its lease statements' last outcome.
OUTAGE_POLL_S = 0.25


class LeaseStatements(Protocol):
    """What the outage watch reads of runtime/cluster.Member (kept apart: no import cycle)."""

    @property
    def problem(self) -> str | None: ...  # why the last lease statement failed, None: it answered

    @property
    def node(self) -> str: ...

    @property
    def instance(self) -> str: ...

    @property
    def row(self) -> Seen | None: ...  # the lease row as last read (the term it held)


class OutageWatch:
    """One owner notice per database outage longer than the lease (rules/outage.py), whichever
    side of the lease this node was on: its lease statements (a leader's renewals, a standby's
    campaign and listen) are tried at least every renew_every, and their last outcome is read
    every OUTAGE_POLL_S. The episode's notice is owed (StorageWaits.notices_owed) once the store
    answers again and recorded first by this node's next term: a node that leads once the
    store is back records it at once; the other's copy, under the same key, is a no-op later.
    Before, a term that ended in an outage was abandoned with the daemon that noticed it, and a
    60 s outage told the owner nothing."""

    def __init__(
        self,
        member: LeaseStatements,
        waits: StorageWaits,
        *,
        lease_ttl: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._member = member
        self._waits = waits
        self._clock = OutageClock(lease_ttl)
        self._monotonic = monotonic
        self._count = 0

    def check(self) -> None:
        """Read the last lease statement's outcome now; an outage that just ended owes its
        notice (one owed notice per key: a later episode under the same term replaces it)."""
        row = self._member.row
        answered = self._member.problem is None
        ended = self._clock.observe(answered, self._monotonic(), None if row is None else row.term)
        if ended is None:
            return
        self._count += 1
        log.warning("storage.outage_ended", seconds=round(ended.seconds, 1), term=ended.term)
        notice = notices.database_outage(
            ended.seconds,
            self._member.node,
            ended.term,
            f"{self._member.instance}:{self._count}",
        )
        owed = [n for n in self._waits.notices_owed if n.key != notice.key]
        self._waits.notices_owed[:] = [*owed, notice]

    async def run(self, stop: asyncio.Event) -> None:
        """`check` every OUTAGE_POLL_S until `stop` (or cancelled)."""
        while not stop.is_set():
            self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), OUTAGE_POLL_S)
