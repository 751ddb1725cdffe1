"""The drill's view of the daemon's store, on either engine, and PostgreSQL's faults.

Every read the drill makes of the daemon's store goes through `db.connect(target, readonly=True)`:
a SQLite file in the state dir, or (`--database DSN`) a schema of the drill's own inside that
PostgreSQL database (`drill_<random>`, named in the DSN's search path, dropped at the end, so a
rerun starts empty). The DSN's password is never printed: only `str(Dsn)` is.

PostgreSQL's faults: `terminate()` ends the daemon's sessions (pg_terminate_backend), found in
pg_stat_activity by the application name the engine gives them and, when the daemon speaks TCP,
by its own client ports (read from /proc), never the drill's own sessions; `restart()` is an
immediate restart of the server (pg_ctl -m immediate, as the data dir's owner).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from ntfy_intake.store import db, postgres

DAEMON_APP = "ntfy-intake"  # the application_name the engine gives every session it opens
DRILL_APP = "ntfy-intake drill"  # the drill's own sessions say so, and are never terminated


def with_schema(dsn: str, schema: str) -> str:
    """`dsn` whose search path is `schema` (as tests/engines.py does)."""
    joiner = "&" if "?" in dsn else "?"
    return f"{dsn}{joiner}options={quote(f'-csearch_path={schema}')}"


def create_schema(server: str, prefix: str = "drill") -> tuple[str, str]:
    """A fresh, empty schema in `server`'s database: (its name, a DSN naming it). The drill,
    the tests (tests/engines.py) and the benches each keep their stores in one of these."""
    schema = f"{prefix}_{secrets.token_hex(6)}"
    conn = db.connect(server)
    try:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    finally:
        conn.close()
    return schema, with_schema(server, schema)


def drop_schema(server: str, schema: str) -> None:
    conn = db.connect(server)
    try:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        conn.close()


@contextlib.contextmanager
def own_schema(server: str, prefix: str = "drill") -> Iterator[tuple[str, str]]:
    """`create_schema`, dropped after."""
    schema, dsn = create_schema(server, prefix)
    try:
        yield schema, dsn
    finally:
        drop_schema(server, schema)


class StoreView:
    """Read-only reads of the daemon's store; None / [] while it cannot be read (not created yet,
    deleted, the server restarting). On PostgreSQL one connection is kept (it reconnects itself
    on the next statement after a break); on SQLite each read opens the file afresh."""

    def __init__(self, target: db.Target) -> None:
        self.target = target
        self.postgres = isinstance(target, db.Dsn)
        self._conn: db.Connection | None = None
        self._reconnects = -1

    def describe(self) -> str:
        return f"PostgreSQL {self.target}" if self.postgres else f"SQLite {self.target}"

    def _pg(self) -> db.Connection:
        if self._conn is None:
            self._conn = db.connect(self.target, readonly=True)
        conn = self._conn
        reconnects = getattr(conn, "reconnects", 0)
        if reconnects != self._reconnects:  # a fresh session carries the engine's name again
            conn.execute(f"SET application_name = '{DRILL_APP}'")
            self._reconnects = reconnects
        return conn

    def rows(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]] | None:
        try:
            if self.postgres:
                return [tuple(r) for r in self._pg().execute(sql, params).fetchall()]
            if not db.exists(self.target):
                return None
            conn = db.connect(self.target, readonly=True)
            try:
                return [tuple(r) for r in conn.execute(sql, params).fetchall()]
            finally:
                conn.close()
        except db.ERRORS:
            return None

    def row(self, sql: str, params: tuple[object, ...] = ()) -> tuple[object, ...] | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(*db.ERRORS):
                self._conn.close()
            self._conn = None


def tcp_ports(pid: int) -> set[int]:
    """The local TCP ports of the sockets process `pid` holds (from /proc)."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def terminate(dsn: str, daemon_pid: int | None) -> int:
    """pg_terminate_backend of the daemon's sessions; how many were ended."""
    conn = db.connect(dsn)
    try:
        conn.execute(f"SET application_name = '{DRILL_APP}'")
        sql = (
            "SELECT pid FROM pg_stat_activity WHERE application_name = ?"
            " AND datname = current_database() AND pid <> pg_backend_pid()"
        )
        params: list[object] = [DAEMON_APP]
        ports = sorted(tcp_ports(daemon_pid)) if daemon_pid is not None else []
        if ports:
            sql += f" AND client_port IN ({', '.join('?' for _ in ports)})"
            params += ports
        pids = [int(r[0]) for r in conn.execute(sql, tuple(params)).fetchall()]
        ended = 0
        for pid in pids:
            row = conn.execute("SELECT pg_terminate_backend(?)", (pid,)).fetchone()
            ended += int(bool(row and row[0]))
        return ended
    finally:
        conn.close()


def pg_ctl() -> str:
    """pg_ctl of the newest installed server (PG_BIN, as scripts/pg-cluster finds it)."""
    if os.environ.get("PG_BIN"):
        return str(Path(os.environ["PG_BIN"]) / "pg_ctl")
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return str(found[-1]) if found else "pg_ctl"


def restart(data_dir: Path) -> str | None:
    """An immediate restart of the server whose data dir this is (as its owner when run as root:
    PostgreSQL refuses to run as root); None when it is back, else why not."""
    command = [pg_ctl(), "-D", str(data_dir), "-m", "immediate", "-w", "-t", "60"]
    command += ["-l", str(data_dir.parent / "server.log"), "restart"]
    if os.geteuid() == 0:
        command = ["runuser", "-u", data_dir.owner(), "--", *command]
    try:
        done = subprocess.run(  # noqa: S603 - pg_ctl on the data dir the operator named
            command, capture_output=True, text=True, check=False, timeout=90
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pg_ctl: {exc}"
    if done.returncode != 0:
        return f"pg_ctl exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    return None


def hold_writer_lock(dsn: str, seconds: float) -> None:
    """Hold the store's write lock (the engine's advisory lock, keyed by schema) for `seconds`,
    as another writer would."""
    conn = postgres.connect(db.Dsn(dsn))
    try:
        conn.execute(f"SET application_name = '{DRILL_APP}'")
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (conn.lock_key,))
        time.sleep(seconds)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
