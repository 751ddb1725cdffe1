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
  wakes without polling the tables: `commit_counter` counts the notifications it has seen;
- a write transaction (`open_write` ... `commit_write`, run by `write_txn`) is one pipeline:
  its statements are sent without waiting for their answers, and the connection waits only
  when the caller reads something (a row, a `rowcount`) and at COMMIT. Each wait is for every
  answer outstanding (a Sync), so the first failed statement's error is raised there, before
  the caller reads anything sent after it, and the transaction is lost (the caller rolls back:
  `rollback_write`); nothing is committed that was not answered without error, COMMIT included.
  On a fenced connection the server compares the term in the opening statement and, when it
  is over, fails it (`_FENCE`): nothing sent after it runs, COMMIT included, and the first wait
  (or the first send that finds the refusal in) raises errors.Fenced, before any answer is
  handed to the caller. A write transaction that reads nothing is one round trip, COMMIT
  included, fenced or not.

psycopg is an optional dependency (`ntfy-intake[postgres]`): this module imports it only when a
DSN is opened (`load_driver`), and says how to install it when it is missing.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ntfy_intake.errors import Fenced, StartupError
from ntfy_intake.settings import dsn as dsn_rules
from ntfy_intake.settings.schema import Dsn

if TYPE_CHECKING:
    import psycopg
    import psycopg.sql


class _Absent(Exception):
    """Stands in for the driver's classes until it is loaded (nothing raises it)."""


# The driver's exceptions, part of `db.ERRORS` once `load_driver` ran (none before: nothing of
# the driver can raise then). Read as this module's attributes at the moment they are caught.
DRIVER_ERRORS: tuple[type[Exception], ...] = ()
DRIVER_ERROR: type[Exception] = _Absent
DRIVER_OPERATIONAL: type[Exception] = _Absent


@functools.cache
def _driver() -> Any:
    import psycopg  # noqa: PLC0415 - a SQLite process never loads the driver (below)
    import psycopg.sql  # noqa: PLC0415

    return psycopg


def load_driver() -> bool:
    """Import psycopg, once, before the first connection: a SQLite daemon never pays for it
    (libpq and its libraries, 113 modules: 10 MB of peak RSS, 60 ms of start-up; docs/
    performance.md, "Memory"). The driver's exceptions join `db.ERRORS` here. False: the
    postgres extra is not installed."""
    global DRIVER_ERRORS, DRIVER_ERROR, DRIVER_OPERATIONAL  # noqa: PLW0603 - once, before use
    if DRIVER_ERRORS:
        return True
    try:
        driver = _driver()
    except ImportError:
        return False
    DRIVER_ERROR, DRIVER_OPERATIONAL = driver.Error, driver.OperationalError
    DRIVER_ERRORS = (driver.Error,)
    return True


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
    if not description:
        return tuple
    index = {column.name: i for i, column in enumerate(description)}
    return functools.partial(Row, index=index)


class Answer:
    """A statement's cursor inside a pipelined write transaction: read it (a row, the rowcount)
    and the connection first waits for the answers outstanding (`PgConnection.answered`), so
    nothing is read before an earlier statement's error is seen and the term is checked."""

    __slots__ = ("_conn", "_cursor")

    def __init__(self, conn: PgConnection, cursor: psycopg.Cursor[Any]) -> None:
        self._conn = conn
        self._cursor = cursor

    def _ready(self) -> psycopg.Cursor[Any]:
        self._conn.answered(self._cursor)
        return self._cursor

    @property
    def rowcount(self) -> int:
        return self._ready().rowcount

    def fetchone(self) -> Any:
        return self._ready().fetchone()

    def fetchall(self) -> list[Any]:
        return self._ready().fetchall()

    def fetchmany(self, size: int = 0) -> list[Any]:
        return self._ready().fetchmany(size)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._ready())


# A fenced write transaction's term check, in its opening statement (after the lock): the
# leadership row FOR KEY SHARE, and unless it holds the connection's term a cast that cannot
# succeed, whose error names what the row holds: the server refuses the transaction (nothing
# after it runs, COMMIT included) and the client learns why at its first wait (`_FENCED`).
_FENCE = (
    ", CASE WHEN (SELECT term FROM leadership WHERE id = 1 FOR KEY SHARE)"
    " IS NOT DISTINCT FROM CAST(%s AS bigint) THEN 0 ELSE CAST('ntfy-intake fenced: '"
    " || coalesce((SELECT 'term ' || term FROM leadership WHERE id = 1), 'no term')"
    " AS integer) END"
)
_FENCED = re.compile(r"ntfy-intake fenced: (term -?\d+|no term)")

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
        self._openings: dict[tuple[bool, bool], str] = {}
        # The write transaction in progress (None outside one): its pipeline.
        self._pipe: contextlib.AbstractContextManager[psycopg.Pipeline] | None = None
        self._pipeline: psycopg.Pipeline | None = None
        # Inside `commits_without_fsync`: write transactions commit without waiting for the WAL.
        self.relaxed = 0
        self.riders: dict[str, Any] = {}  # owed to the next write transaction (transaction.ride)
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
        if self._pipe is not None:
            # Inside a write transaction: sent now, answered when first read (module doc). Never
            # reconnects: a broken session fails the statement and the transaction is lost.
            try:
                return Answer(self, self.raw.execute(translate(sql), _params(params)))
            except DRIVER_ERROR as exc:  # answers already in are read at each send
                raise self._as_fenced(exc) from None
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
            key = _driver().sql.Literal(self.lock_key).as_string(raw)
            channel = _driver().sql.Literal(self.channel).as_string(raw)
            fence = ", (SELECT term FROM leadership WHERE id = 1 FOR KEY SHARE)" if fenced else ""
            lock = f"pg_advisory_xact_lock(hashtext({key})), pg_notify({channel}, '')"
            begin = f"BEGIN; SELECT {lock}{fence}"
            self._begins[fenced] = begin
        cursor = raw.execute(begin.encode())
        cursor.nextset()  # past BEGIN's result to the SELECT's
        row = cursor.fetchone()
        return None if not fenced or row is None or row[2] is None else int(row[2])

    def executemany(self, sql: str, seq: Any) -> Any:
        rows = [_params(p) for p in seq]
        if self._pipe is not None:
            cursor = self.raw.cursor()
            if rows:  # rides the transaction's pipeline: answered at the next wait
                try:
                    cursor.executemany(translate(sql), rows)
                except DRIVER_ERROR as exc:
                    raise self._as_fenced(exc) from None
            return Answer(self, cursor)
        cursor = self._usable().cursor()
        if rows:  # none: no statement, and no round trip for the pipeline psycopg would open
            cursor.executemany(translate(sql), rows)
        return cursor

    # -- the write transaction, pipelined (module doc) -------------------------------------------

    def open_write(self) -> None:
        """`write_txn`'s opening: BEGIN, the store's write lock, the commit wake-up and, when
        fenced, the leadership row FOR KEY SHARE with its term compared on the server (inside
        `commits_without_fsync` also synchronous_commit off for this transaction), sent without
        waiting. The lock is taken in that order, before any statement of the transaction runs.
        A term that is over fails the opening statement (`_FENCE`): the server skips everything
        sent after it, COMMIT included, and the transaction's first wait raises errors.Fenced."""
        raw = self._usable()
        fenced, relaxed = self.term is not None, self.relaxed > 0
        opening = self._openings.get((fenced, relaxed))
        if opening is None:
            # The literals quoted by the driver, then `%` doubled: the statement has a parameter.
            key = _driver().sql.Literal(self.lock_key).as_string(raw).replace("%", "%%")
            channel = _driver().sql.Literal(self.channel).as_string(raw).replace("%", "%%")
            lock = f"pg_advisory_xact_lock(hashtext({key})), pg_notify({channel}, '')"
            relax = ", set_config('synchronous_commit', 'off', true)" if relaxed else ""
            opening = f"SELECT {lock}{relax}{_FENCE if fenced else ''}"
            self._openings[(fenced, relaxed)] = opening
        pipe = raw.pipeline()
        self._pipeline = pipe.__enter__()
        self._pipe = pipe
        raw.execute("BEGIN")
        raw.execute(opening, (self.term,) if fenced else None)

    def answered(self, cursor: Any = None) -> None:
        """Inside a write transaction: wait for the answers to everything sent so far (none
        when `cursor`'s answer is in already). Raises the first failed statement's error (the
        transaction is lost), or errors.Fenced."""
        if self._pipeline is None:
            return
        if cursor is not None and cursor.pgresult is not None:
            return
        with self._fence_raised():
            self._pipeline.sync()

    def commit_write(self) -> None:
        """COMMIT, and wait for every answer outstanding with it: one round trip."""
        with self._fence_raised():
            self.raw.execute("COMMIT")  # the driver reads answers already in as it sends
            self._end_pipeline()

    @contextlib.contextmanager
    def _fence_raised(self) -> Iterator[None]:
        """The opening statement's refusal (`_FENCE`) as errors.Fenced, with the term it saw."""
        try:
            yield
        except DRIVER_ERROR as exc:
            raise self._as_fenced(exc) from None

    def _as_fenced(self, exc: Exception) -> Exception:
        """errors.Fenced for the opening statement's refusal (a transaction's statement, its
        wait or its COMMIT can be where the driver reads it); any other error as it is."""
        seen = _FENCED.search(str(exc))
        if self.term is None or seen is None:
            return exc
        return Fenced(
            f"term {self.term} is over (the leadership row holds {seen.group(1)}):"
            " this write is rolled back"
        )

    def rollback_write(self) -> None:
        """Roll the write transaction back, in whatever state it is; a driver error on the way
        is swallowed (the caller raises the cause). Outside one, ROLLBACK if a transaction is
        open (a failed `begin_write`)."""
        if self._pipe is not None:
            with contextlib.suppress(DRIVER_ERROR):
                # Skipped by the server when an earlier statement since the last wait failed:
                # the transaction is then still open (failed) after the wait, rolled back below.
                self.raw.execute("ROLLBACK")
            with contextlib.suppress(DRIVER_ERROR):
                self._end_pipeline()
            self._pipe = self._pipeline = None
        if self.in_transaction:
            with contextlib.suppress(DRIVER_ERROR):
                self.raw.execute("ROLLBACK")

    def _end_pipeline(self) -> None:
        pipe, self._pipe, self._pipeline = self._pipe, None, None
        if pipe is not None:
            pipe.__exit__(None, None, None)  # a Sync: the answers outstanding, errors raised

    @property
    def in_transaction(self) -> bool:
        return bool(self.raw.info.transaction_status != _driver().pq.TransactionStatus.IDLE)

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
    for value in params:  # most statements have nothing to map: passed on as they are
        if isinstance(value, list) or (isinstance(value, str) and "\x00" in value):
            return tuple(_text(value) for value in params)
    return params


def stored_text(value: str) -> str:
    """What a text value reads back as once stored (`_text`)."""
    return value.replace("\x00", "\ufffd")


def _text(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: it is stored as U+FFFD, the way the daemon already stores
    bytes that are not text (a base64 body, a junk frame). Lookups map the same way, so a key
    with a NUL still finds its row; the audit log keeps the original."""
    if isinstance(value, str) and "\x00" in value:
        return stored_text(value)
    if isinstance(value, list):  # an array parameter: its strings alike
        return [_text(item) for item in value]
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
    if not load_driver():  # pragma: no cover - depends on the install
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
    given = dsn_rules.checked(dsn.conninfo).get("options")
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
    given = dsn_rules.checked(dsn.conninfo)  # StartupError for a DSN libpq would misread
    defaults = {key: value for key, value in _DEAD_PEER.items() if key not in given}
    load_driver()  # `connect` made sure it is installed; a reconnect finds it loaded
    with dsn_rules.redacting(dsn.conninfo, DRIVER_ERROR):
        raw: psycopg.Connection[Any] = _driver().connect(
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
