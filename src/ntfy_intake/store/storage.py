"""Storage and environment failures, named: what went wrong, where, and whether waiting helps.

Pure, except `check_state_dir` (a few stat/open calls at start-up). SQLite reports a full disk,
a lock held by another process and a corrupt file as bare `OperationalError`/`DatabaseError`
strings, and a failed statement inside a transaction often surfaces as the ROLLBACK's "cannot
rollback - no transaction is active" instead of its cause; `classify` maps both the exception
and its cause chain to one of a few named kinds, so logs, notices and the start-up line say
"disk full" and not a SQLite internals message.

Permanent causes (a state dir that is not a writable directory, a corrupt database, a
read-only audit file) stop start-up with exit 2 and one line; transient ones (disk full, the
database locked by another process) are waited out by the daemon and never exit.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ntfy_intake.errors import DatabaseUnreachable, IntakeError, StartupError
from ntfy_intake.settings import dsn as dsn_rules
from ntfy_intake.settings.schema import Dsn
from ntfy_intake.store import postgres

Kind = Literal[
    "disk_full",
    "file_too_large",
    "locked",
    "corrupt",
    "permission",
    "io",
    "unreachable",
    "refused",
    "no_database",
    "malformed",
    "other",
]
TRANSIENT: frozenset[Kind] = frozenset(
    {"disk_full", "file_too_large", "locked", "io", "unreachable"}
)

_WORDS: dict[Kind, str] = {
    "disk_full": "disk full",
    "file_too_large": "file size limit reached",
    "locked": "database locked by another process",
    "corrupt": "database file is corrupt",
    "permission": "permission denied",
    "io": "I/O error",
    "unreachable": "database unreachable",
    "refused": "database refused the login",
    "no_database": "no such database",
    "malformed": "the DSN is malformed",
    "other": "storage error",
}


@dataclass(frozen=True, slots=True)
class StorageFault:
    kind: Kind
    where: str  # a path or a short name ("database", "audit log")
    detail: str  # the original error text

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT

    def __str__(self) -> str:
        return f"{_WORDS[self.kind]} on {self.where} ({self.detail})"


def classify(exc: BaseException, where: str) -> StorageFault:
    """The named cause of `exc`, looking through its __cause__/__context__ chain."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for item in chain:
        kind = _kind_of(item)
        if kind != "other":
            return StorageFault(kind, where, _text(item))
    return StorageFault("other", where, _text(exc))


_ERRNO_KINDS: dict[int, Kind] = {
    errno.ENOSPC: "disk_full",
    errno.EDQUOT: "disk_full",
    errno.EFBIG: "file_too_large",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.EROFS: "permission",
    errno.EIO: "io",
}


# PostgreSQL's SQLSTATEs by what they mean here (appendix A of its manual).
_SQLSTATE_KINDS: dict[str, Kind] = {
    "53100": "disk_full",  # disk_full
    "53200": "io",  # out_of_memory
    "53300": "unreachable",  # too_many_connections: waiting helps
    "55P03": "locked",  # lock_not_available
    "40P01": "locked",  # deadlock_detected
    "40001": "locked",  # serialization_failure
    "57P01": "unreachable",  # admin_shutdown (pg_terminate_backend, a restart)
    "57P02": "unreachable",  # crash_shutdown
    "57P03": "unreachable",  # cannot_connect_now (starting up, shutting down)
    "58030": "io",  # io_error
    "28P01": "refused",  # invalid_password
    "28000": "refused",  # invalid_authorization_specification
    "3D000": "no_database",  # invalid_catalog_name
    "42501": "permission",  # insufficient_privilege
    "25006": "permission",  # read_only_sql_transaction
    "XX001": "corrupt",  # data_corrupted
    "XX002": "corrupt",  # index_corrupted
}


# A connection parameter libpq or psycopg refuses at connect (libpq checks ports, modes and
# options only then): no wait makes it valid, only a person can (issue 32: it was taken for
# "unreachable" and waited out for ever).
_MALFORMED = re.compile(
    r"invalid [\w ]*value|could not match \d+ (?:port numbers|host names)|bad value for"
    r"|invalid connection option|invalid uri|percent-encoded|connection info string"
)


def _pg_kind(exc: BaseException) -> Kind:
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in _SQLSTATE_KINDS:
        return _SQLSTATE_KINDS[sqlstate]
    text = str(exc).lower()
    # At connect time the server's refusal often comes without a SQLSTATE: read its words.
    if (
        "password authentication failed" in text
        or "no pg_hba.conf entry" in text
        or ("role" in text and "does not exist" in text)
        or "authentication failed" in text
    ):
        return "refused"
    if "database" in text and "does not exist" in text:
        return "no_database"
    if sqlstate is None and _MALFORMED.search(text):
        return "malformed"
    if isinstance(exc, postgres.DRIVER_OPERATIONAL) or sqlstate in (None, "08000", "08006"):
        # A connection that failed, broke or was closed: the server may come back.
        return "unreachable"
    return "other"


def _kind_of(exc: BaseException) -> Kind:
    if postgres.DRIVER_ERRORS and isinstance(exc, postgres.DRIVER_ERRORS):
        return _pg_kind(exc)
    if isinstance(exc, OSError):
        return _ERRNO_KINDS.get(exc.errno or 0, "other")
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or ""
        text = str(exc).lower()
        if name == "SQLITE_FULL" or "disk is full" in text:
            return "disk_full"
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
            return "locked"
        if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text:
            return "corrupt"
        if "not a database" in text:
            return "corrupt"
        if name.startswith(("SQLITE_READONLY", "SQLITE_PERM", "SQLITE_CANTOPEN")):
            return "permission"
        if "readonly" in text or "unable to open" in text:
            return "permission"
        if name.startswith("SQLITE_IOERR") or "disk i/o error" in text:
            return "io"
    return "other"


def _text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def startup_error(exc: BaseException, database: Path | Dsn) -> IntakeError:
    """The one line a storage failure at start-up becomes: StartupError (exit 2) when only a
    person can fix it, a plain IntakeError (exit 1: a restart may help) when it is transient."""
    if isinstance(database, Dsn):
        return _postgres_startup_error(exc, database)
    where = (
        str(database)
        if isinstance(exc, sqlite3.Error)
        else str(getattr(exc, "filename", None) or database.parent)
    )
    fault = classify(exc, where)
    if fault.kind == "corrupt":
        return StartupError(
            f"database {database} is corrupt ({fault.detail}): move it aside"
            f" (mv {database} {database}.corrupt) and start again; the next start rebuilds it"
            " from the audit log"
        )
    if fault.kind == "permission":
        return StartupError(str(fault))
    return IntakeError(str(fault))


def _postgres_startup_error(exc: BaseException, dsn: Dsn) -> IntakeError:
    """Host, database and cause, never the password: the DSN's `str` leaves it out, and the
    driver's text is redacted by the parsed password in every form (settings/dsn.py), at the
    source (`postgres.connect`) and here again for an error that did not come through it."""
    dsn_rules.redact_exception(exc, dsn.conninfo)
    fault = classify(exc, f"{dsn.host}, database {dsn.database}")
    detail = dsn.redact(_first_line(fault.detail).replace(dsn.conninfo, str(dsn)))
    line = f"PostgreSQL {dsn}: {_WORDS[fault.kind]} ({detail})"
    if fault.kind == "unreachable":
        return DatabaseUnreachable(line)
    if fault.transient:
        return IntakeError(line)
    return StartupError(line)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def check_state_dir(directory: Path) -> str | None:
    """Why `directory` cannot hold the state (one line), or None when it can."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        return f"state dir {directory} is not a directory"
    except OSError as exc:
        return f"state dir {directory} cannot be created: {_text(exc)}"
    if not directory.is_dir():
        return f"state dir {directory} is not a directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"state dir {directory} is not writable: permission denied"
    return None


def check_audit_files(audit_dir: Path, files: list[Path]) -> str | None:
    """A read-only audit directory or newest audit file cannot be repaired or appended to."""
    if audit_dir.exists() and not audit_dir.is_dir():
        return f"audit dir {audit_dir} is not a directory"
    if audit_dir.is_dir() and not os.access(audit_dir, os.W_OK | os.X_OK):
        return f"audit dir {audit_dir} is not writable: permission denied"
    for path in files:
        if not os.access(path, os.W_OK):
            return f"audit file {path} is read-only: permission denied"
    return None


def waitable(exc: BaseException, where: str) -> StorageFault | None:
    """The transient fault a failed database call names (locked, disk full, I/O), which waiting
    out and running the same transaction again may cure; None for anything else."""
    if not isinstance(exc, sqlite3.OperationalError | postgres.DRIVER_OPERATIONAL):
        return None
    fault = classify(exc, where)
    return fault if fault.transient else None


def is_storage_error(exc: BaseException) -> bool:
    """A database or file-system error: what start-up turns into one named line."""
    return isinstance(exc, sqlite3.Error | OSError | postgres.DRIVER_ERROR)
