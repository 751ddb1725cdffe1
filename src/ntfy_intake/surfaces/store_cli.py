"""`ntfy-intake store copy --to DSN`: move a one-box state into an empty PostgreSQL database
(store/copy.py; docs/postgresql.md). `ntfy-intake store repage`: rewrite a SQLite store made
before 2 KiB pages with them (store/db.py `repage`; docs/performance.md says what it saves).

The source is this config's state dir: its SQLite database when there is one, or else only its
audit log (which the copy rebuilds into PostgreSQL, as a daemon would on an empty database).
The caller holds the state dir's daemon lock throughout, so no daemon writes the source
meanwhile. One line on success; one line and exit 2 when the target holds a store already,
refuses the login, or is a DSN libpq refuses or would misread (settings/dsn.py); never the
password, nor any piece of it (what the driver says is redacted: store/postgres.py).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Protocol

from ntfy_intake.errors import ConfigError, StartupError
from ntfy_intake.flow.pipeline import append_triage_entry
from ntfy_intake.settings import Settings
from ntfy_intake.settings import dsn as dsn_rules
from ntfy_intake.settings.schema import Dsn
from ntfy_intake.store import audit, copy, db, migrations, rebuild, storage

__all__ = ["add_arguments", "repage", "run", "target_dsn"]


def add_arguments(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`store copy`'s arguments; returns the actions' parsers."""
    actions = parser.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    action = actions.add_parser(
        "copy", help="copy this state (SQLite, or only its audit log) into an empty PostgreSQL"
    )
    where = action.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", metavar="DSN", help="postgresql://user@host/db")
    where.add_argument(
        "--to-file",
        type=Path,
        metavar="FILE",
        help="a file holding the DSN (keeps a password off ps)",
    )
    actions.add_parser(
        "repage",
        help=f"rewrite this SQLite store with {db.PAGE_SIZE}-byte pages (the daemon stopped)",
    )
    return list(actions.choices.values())


def target_dsn(args: argparse.Namespace) -> Dsn:
    """The target, read by libpq's parser as `[state] database` is (settings/dsn.py): a DSN
    it refuses or would misread is one line naming the option, never the value."""
    option = "--to" if args.to is not None else "--to-file"
    text = args.to if args.to is not None else _read(args.to_file)
    try:
        dsn_rules.check(text)
    except dsn_rules.DsnError as exc:
        raise ConfigError(f"store copy {option}", str(exc)) from None
    return Dsn(text)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise StartupError(f"store copy --to-file {path}: {exc.strerror}") from None


class Lock(Protocol):
    def acquire(self) -> None: ...
    def release(self) -> None: ...


def run(settings: Settings, dsn: Dsn, daemon_lock: Lock) -> int:
    """Copy, holding the state dir's daemon lock: no daemon writes the source meanwhile."""
    if not settings.state.dir.is_dir():
        raise StartupError(f"nothing to copy: no state dir {settings.state.dir}")
    _lock(daemon_lock, settings.state.dir, "store copy")
    try:
        return _copy(settings, dsn)
    finally:
        daemon_lock.release()


def _lock(daemon_lock: Lock, state_dir: Path, command: str) -> None:
    """The daemon lock, or one line: a state dir that refuses the lock file (read-only, not
    ours) is a StartupError, not a traceback."""
    try:
        daemon_lock.acquire()
    except OSError as exc:
        raise StartupError(f"{command}: cannot lock {state_dir}: {exc.strerror}") from None


def repage(settings: Settings, daemon_lock: Lock) -> int:
    """`store repage`, holding the state dir's daemon lock (no daemon has the file open): one
    line saying what was done. One line and exit 2 when there is no SQLite store or its dir
    cannot be locked (read-only); exit 1 when the rewrite fails for want of room or while a
    daemon runs (the file is then as it was, and a retry may pass)."""
    if settings.state.database is not None:
        raise StartupError("store repage: the store is PostgreSQL; pages are a SQLite file's")
    source = settings.state.database_file
    if not source.exists():
        raise StartupError(f"store repage: no database {source}")
    _lock(daemon_lock, settings.state.dir, "store repage")
    try:
        conn = db.connect(source)
        try:
            before = db.page_size(conn)
            if before == db.PAGE_SIZE:
                print(f"{source} has {before}-byte pages already: nothing to do")
                return 0
            started = time.monotonic()
            db.repage(conn)
            after = db.page_size(conn)
        finally:
            conn.close()
    except db.ERRORS as exc:
        raise storage.startup_error(exc, source) from None
    finally:
        daemon_lock.release()
    took = time.monotonic() - started
    print(f"rewrote {source}: {before}-byte pages -> {after}-byte pages in {took:.1f} s")
    return 0


def _copy(settings: Settings, dsn: Dsn) -> int:
    source = settings.state.database_file
    try:
        target = db.connect(dsn)
    except db.ERRORS as exc:
        raise storage.startup_error(exc, dsn) from None
    try:
        if source.exists():
            copied = _from_sqlite(source, target, settings)
            print(f"copied {source} into {dsn}: {copied}")
        elif audit.log_files(settings.state.audit_dir):
            summary = _from_audit(target, settings)
            print(f"rebuilt {dsn} from the audit log in {settings.state.audit_dir}: {summary}")
        else:
            raise StartupError(
                f"nothing to copy: no database {source} and no audit log in"
                f" {settings.state.audit_dir}"
            )
    except db.ERRORS as exc:
        raise storage.startup_error(exc, dsn) from None
    finally:
        target.close()
    print(
        f"next: set [state] database (or NTFY_INTAKE_STATE_DATABASE) to {dsn} and start the daemon"
    )
    return 0


def _from_sqlite(source: Path, target: db.Connection, settings: Settings) -> copy.Copied:
    seqs = (r.get("seq") for r in audit.read_records(settings.state.audit_dir))
    top = max((s for s in seqs if isinstance(s, int)), default=0)
    return copy.copy_file(source, target, audit_top=top)


def _from_audit(target: db.Connection, settings: Settings) -> rebuild.Summary:
    migrations.apply(target)
    copy.refuse_unless_empty(target, str(settings.state.store))
    summary = rebuild.from_audit(
        target,
        settings.state.audit_dir,
        time.time(),
        debounce=settings.cadence.debounce,
        relay_enabled=settings.relay.url is not None,
        feed_append=append_triage_entry,
    )
    if summary is None:
        raise StartupError(f"nothing to copy: the audit log in {settings.state.audit_dir} is empty")
    return summary
