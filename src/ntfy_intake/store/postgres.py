"""The PostgreSQL engine (DESIGN.md section 9): a psycopg 3 connection that speaks the store's
connection contract (store/__init__.py), so the store's modules run their statements on either
engine.

Invariants owned here:
- a connection is in autocommit (no transaction opened implicitly), `synchronous_commit = on`
  (a COMMIT returns once the WAL is flushed: as durable as SQLite's synchronous=FULL), in UTC,
  with a search path naming the store's schema (a DSN may name one with `options`);
- statements are written once, in the store's SQLite-flavoured text with `?` and `:name`
  placeholders, and rewritten here into psycopg's `%s` / `%(name)s` (a literal `%` doubled).
  Where the dialects really differ, the store module names both statements (`dialect.pick`);
  nothing here guesses at SQL beyond its placeholders;
- rows answer by position and by column name, as sqlite3.Row does;
- write transactions serialize on one advisory lock per store (the schema), taken right after
  BEGIN: as SQLite's BEGIN IMMEDIATE, a writer waits for the previous one instead of racing it
  (the feed's `max(seq) + 1`, the cursor's forward-only rules rely on that);
- every committed write transaction NOTIFYs the store's channel, so a watcher (the doorbell)
  wakes without polling the tables: `commit_counter` counts the notifications it has seen.

psycopg is an optional dependency (`ntfy-intake[postgres]`): this module imports it only when a
DSN is opened, and says how to install it when it is missing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ntfy_intake.errors import StartupError
from ntfy_intake.settings.schema import Dsn

try:
    import psycopg
    import psycopg.conninfo
    import psycopg.sql
    from psycopg import pq
except ImportError:  # pragma: no cover - the postgres extra is not installed
    psycopg = None  # type: ignore[assignment]

# The driver's exceptions (none when it is not installed): part of `db.ERRORS`.
DRIVER_ERRORS: tuple[type[Exception], ...] = () if psycopg is None else (psycopg.Error,)


class _Absent(Exception):
    """Stands in for the driver's classes when it is not installed (nothing raises it)."""


DRIVER_ERROR: type[Exception] = _Absent if psycopg is None else psycopg.Error
DRIVER_OPERATIONAL: type[Exception] = _Absent if psycopg is None else psycopg.OperationalError


class Row(Sequence[Any]):
    """A result row read by position or by column name (the sqlite3.Row contract)."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: Mapping[str, int]) -> None:
        self._values = tuple(values)
        self._index = index

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self._values[self._index[key]]
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Row):
            return self._values == other._values
        return self._values == other

    def __hash__(self) -> int:
        return hash(self._values)

    def __repr__(self) -> str:
        return f"Row{self._values!r}"

    def keys(self) -> list[str]:
        return list(self._index)


def _rows(cursor: Any) -> Any:
    description = cursor.description
    if description is None:
        return tuple
    index = {column.name: i for i, column in enumerate(description)}
    return functools.partial(Row, index=index)


_PLACEHOLDER = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|%|\?|(?<![:\w]):([A-Za-z_]\w*)")


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """The store's statement with psycopg's placeholders: `?` -> `%s`, `:name` -> `%(name)s`,
    `%` -> `%%`; quoted literals and identifiers are left alone."""

    def replace(match: re.Match[str]) -> str:
        found = match.group(0)
        if found == "?":
            return "%s"
        if found == "%":
            return "%%"
        if match.group(1) is not None:
            return f"%({match.group(1)})s"
        return found.replace("%", "%%") if found.startswith("'") else found

    return _PLACEHOLDER.sub(replace, sql)


class PgConnection:
    """One psycopg connection behind the store's connection contract (module doc)."""

    dialect = "postgresql"

    def __init__(
        self, dsn: Dsn, *, readonly: bool, timeout: float, libpq: Mapping[str, Any] | None = None
    ) -> None:
        self.dsn = dsn
        self.readonly = readonly
        self.timeout = timeout
        self._libpq = dict(libpq or {})
        self.notifications = 0
        self.reconnects = 0
        # The leadership term this connection's write transactions are fenced to (DESIGN.md
        # section 9): set on the leader's connection for intake, relay and owner writes; None
        # writes unfenced (one daemon alone, the feed's acks, the CLI).
        self.term: int | None = None
        # How long the server lets a transaction of this connection sit idle (a leader's: a
        # process stopped inside one must not hold the takeover's lock for ever).
        self.idle_in_transaction: float | None = None
        self._begins: dict[bool, str] = {}
        self._listening = False
        self._closed = False
        self.raw = _open(dsn, readonly=readonly, timeout=timeout, libpq=self._libpq)
        row = self.raw.execute("SELECT current_schema()").fetchone()
        self.schema = str(row[0] if row else "public")

    def _usable(self) -> psycopg.Connection[Any]:
        """The live connection. One that broke (the server restarted, the session was
        terminated, the network dropped) is replaced on the next statement outside a
        transaction; inside one, the statement fails and the transaction is lost (the caller
        runs it again: every call through the store is one transaction)."""
        if self.raw.broken and not self._closed:
            self.raw.close()
            self.raw = _open(
                self.dsn, readonly=self.readonly, timeout=self.timeout, libpq=self._libpq
            )
            self.reconnects += 1
            if self.idle_in_transaction is not None:
                self._bound_idle_transactions()
            if self._listening:
                # NOTIFYs sent while disconnected are gone: count a change, so a watcher
                # queries once instead of missing what happened meanwhile.
                self._listening = False
                self.notifications += 1
                self.listen()
        return self.raw

    @property
    def channel(self) -> str:
        return f"ntfy_intake.{self.schema}"

    @property
    def lock_key(self) -> str:
        return f"ntfy-intake writer {self.schema}"

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        return self._usable().execute(translate(sql), _params(params))

    def fence(self, term: int | None, idle_in_transaction: float | None) -> None:
        """Fence write transactions to `term` (None: unfenced) and bound idle transactions."""
        self.term = term
        self.idle_in_transaction = idle_in_transaction
        self._bound_idle_transactions()

    def _bound_idle_transactions(self) -> None:
        ms = (
            0
            if self.idle_in_transaction is None
            else max(1, round(self.idle_in_transaction * 1000))
        )
        self.raw.execute(f"SET idle_in_transaction_session_timeout = {ms}")

    def begin_write(self) -> int | None:
        """BEGIN, the store's write lock, the commit wake-up and, when fenced, the leadership
        row FOR KEY SHARE with its term: one round trip (a simple-protocol query of literal
        statements; the lock key and channel are quoted by the driver). Returns the row's term
        when fenced (None when the row is absent), None otherwise."""
        fenced = self.term is not None
        raw = self._usable()
        begin = self._begins.get(fenced)
        if begin is None:
            key = psycopg.sql.Literal(self.lock_key).as_string(raw)
            channel = psycopg.sql.Literal(self.channel).as_string(raw)
            fence = ", (SELECT term FROM leadership WHERE id = 1 FOR KEY SHARE)" if fenced else ""
            lock = f"pg_advisory_xact_lock(hashtext({key})), pg_notify({channel}, '')"
            begin = f"BEGIN; SELECT {lock}{fence}"
            self._begins[fenced] = begin
        cursor = raw.execute(begin.encode())
        cursor.nextset()  # past BEGIN's result to the SELECT's
        row = cursor.fetchone()
        return None if not fenced or row is None or row[2] is None else int(row[2])

    def executemany(self, sql: str, seq: Any) -> Any:
        cursor = self._usable().cursor()
        cursor.executemany(translate(sql), [_params(p) for p in seq])
        return cursor

    @property
    def in_transaction(self) -> bool:
        return bool(self.raw.info.transaction_status != pq.TransactionStatus.IDLE)

    def listen(self) -> None:
        if not self._listening:
            raw = self._usable()
            raw.add_notify_handler(self._notified)
            raw.execute(f'LISTEN "{self.channel}"')
            self._listening = True

    def _notified(self, _notify: object) -> None:
        self.notifications += 1

    def close(self) -> None:
        self._closed = True
        self.raw.close()

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed or self.raw.broken)


def _params(params: Sequence[Any] | Mapping[str, Any]) -> Any:
    if isinstance(params, Mapping):
        return {name: _text(value) for name, value in params.items()}
    return tuple(_text(value) for value in params)


def _text(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: it is stored as U+FFFD, the way the daemon already stores
    bytes that are not text (a base64 body, a junk frame). Lookups map the same way, so a key
    with a NUL still finds its row; the audit log keeps the original."""
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


def connect(
    dsn: Dsn,
    *,
    readonly: bool = False,
    timeout: float = 10.0,
    libpq: Mapping[str, Any] | None = None,
    statement_timeout: float | None = None,
) -> PgConnection:
    """Open `dsn` with the settings every store module relies on (module doc); `libpq` adds
    connection parameters (the lease's TCP keepalives); `statement_timeout` bounds every
    statement on the server (seconds; none by default)."""
    if psycopg is None:  # pragma: no cover - depends on the install
        raise StartupError(
            f"database {dsn}: PostgreSQL needs psycopg: install ntfy-intake[postgres]"
        )
    extra = dict(libpq or {})
    if statement_timeout is not None:
        extra["options"] = " ".join(
            [*_options_of(dsn), f"-c statement_timeout={round(statement_timeout * 1000)}"]
        )
    return PgConnection(dsn, readonly=readonly, timeout=timeout, libpq=extra)


def _options_of(dsn: Dsn) -> list[str]:
    # A keyword given to psycopg.connect replaces the DSN's own `options` (which may name the
    # search path): keep them.
    given = psycopg.conninfo.conninfo_to_dict(dsn.conninfo).get("options")
    return [str(given)] if given else []


# A server that stopped answering (a network cut, a box that froze) fails the session within
# about half a minute instead of the kernel's two hours, so a node cut off from the database
# stands by instead of hanging in a statement: TCP keepalives and a user timeout, unless the DSN
# names its own or the caller tightens them (the lease's connection).
_DEAD_PEER: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


def _open(
    dsn: Dsn, *, readonly: bool, timeout: float, libpq: Mapping[str, Any]
) -> psycopg.Connection[Any]:
    given = psycopg.conninfo.conninfo_to_dict(dsn.conninfo)
    defaults = {key: value for key, value in _DEAD_PEER.items() if key not in given}
    raw = psycopg.connect(
        dsn.conninfo,
        autocommit=True,
        row_factory=_rows,
        connect_timeout=max(1, round(timeout)),
        application_name="ntfy-intake",
        **{**defaults, **libpq},
    )
    try:
        raw.execute("SET synchronous_commit = on")
        # As SQLite's busy timeout: a writer waiting on the store's lock past it fails with
        # lock_not_available (55P03, "locked": waited out, degraded, noticed), not forever.
        raw.execute(f"SET lock_timeout = '{round(timeout * 1000)}ms'")
        raw.execute("SET TIME ZONE 'UTC'")
        if readonly:
            raw.execute("SET default_transaction_read_only = on")
        return raw
    except BaseException:
        raw.close()
        raise
