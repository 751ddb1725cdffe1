"""PostgreSQL's own faults (issue 23, item 2), each named after what it would break: a server
that does not answer at start-up, and the daemon's sessions terminated mid-stream."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from ntfy_intake.store import db
from ntfy_intake.testbed import drill_store
from ntfy_intake.testbed.emulator import NtfyEmulator

from .. import harness, ports
from ..harness import audit_records, daemon_process, env_for, event_ids, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("engine", ["postgresql"], indirect=True)]


free_port = ports.free_port


def via_port(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


@contextmanager
def forwarder(listen_port: int, target: tuple[str, int]) -> Iterator[None]:
    """A TCP forwarder on `listen_port` to the real server: PostgreSQL "coming up" there."""
    server = socket.create_server(("127.0.0.1", listen_port))
    stopping = threading.Event()
    sockets: list[socket.socket] = [server]

    def pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def accept() -> None:
        while not stopping.is_set():
            try:
                client, _ = server.accept()
            except OSError:
                return
            if stopping.is_set():
                client.close()
                return
            upstream = socket.create_connection(target)
            sockets.extend((client, upstream))
            threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopping.set()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        thread.join(timeout=5)


def test_postgresql_not_answering_at_start_up_is_waited_out_not_an_exit(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Failure mode: the database box still booting turns into a daemon restart loop (exit at
    start-up), or a daemon that never notices it came back."""
    assert harness.DATABASE is not None
    real = urlsplit(harness.DATABASE)
    port = free_port()
    state = tmp_path / "state"
    env = env_for(emu.url, state)
    env["NTFY_INTAKE_STATE_DATABASE"] = via_port(harness.DATABASE, port)
    log = tmp_path / "daemon.log"
    with log.open("wb") as sink, daemon_process(env, stdout=sink) as proc:
        # Its first attempt refused, said in its log: a fixed 3 s sleep was over before a
        # daemon starting under the parallel suite's load had tried (no wait, no notice owed).
        wait_until(
            lambda: '"event": "storage.waiting"' in log.read_text(),
            timeout=30,
            what="the daemon waiting for the database",
        )
        time.sleep(2)  # more attempts refused (its backoff starts at 0.5 s)
        assert proc.poll() is None, "the daemon exited while PostgreSQL was down"
        assert emu.subscriber_count() == 0
        with forwarder(port, (real.hostname or "127.0.0.1", real.port or 5432)):
            emu.wait_for_subscribers(1, timeout=30)
            published = emu.publish("alerts", "disk full", title="Disk")["id"]
            wait_until(lambda: published in event_ids(state), timeout=30)
            wait_until(
                lambda: any(
                    r["kind"] == "notice" and r.get("notice") == "storage_fault"
                    for r in audit_records(state)
                ),
                timeout=30,
                what="one storage notice once the database answered",
            )
    notices = [
        r for r in audit_records(state) if r["kind"] == "notice" and r["notice"] == "storage_fault"
    ]
    assert len(notices) == 1


def _terminate_daemon_sessions(dsn: str, pid: int) -> int:
    # Only this daemon's sessions (by their client ports): other tests share the server.
    return drill_store.terminate(dsn, pid)


def test_terminated_sessions_mid_stream_lose_and_double_nothing(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Failure mode: a connection killed under the writer (pg_terminate_backend, a failover
    of the database) loses the batch in flight, or records it twice after reconnecting."""
    assert harness.DATABASE is not None
    state = tmp_path / "state"
    with daemon_process(env_for(emu.url, state)) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        published: list[str] = []
        terminated = 0
        for round_ in range(5):
            published += [
                emu.publish("alerts", f"alert {round_}-{n}", title=f"Alert {round_}-{n}")["id"]
                for n in range(20)
            ]
            terminated += _terminate_daemon_sessions(harness.DATABASE, proc.pid)
            # Recorded after the reconnect, before the next round kills the new session.
            wait_until(lambda p=tuple(published): set(p) <= set(event_ids(state)), timeout=60)
        assert terminated >= 5
        assert proc.poll() is None
    assert Counter(event_ids(state)) == Counter(published)  # each once, none lost


def test_store_lock_held_past_the_lock_timeout_is_waited_out_and_noticed(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Failure mode: another session holding the store's write lock (a stuck `store copy`, an
    operator's open transaction) makes the writer wait forever, silently: no degraded health,
    no notice. As SQLite's busy timeout: past 10 s the write fails as "locked", is retried with
    backoff, and the owner hears of it once."""
    assert harness.DATABASE is not None
    state = tmp_path / "state"
    with daemon_process(env_for(emu.url, state)) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        first = emu.publish("alerts", "before the lock", title="Before")["id"]
        wait_until(lambda: first in event_ids(state), timeout=30)
        holder = db.connect(harness.DATABASE)
        try:
            with db.write_txn(holder):  # the store's advisory write lock, held
                during = emu.publish("alerts", "while locked", title="Locked")["id"]
                time.sleep(12.5)
                assert during not in event_ids(state)
        finally:
            holder.close()
        wait_until(lambda: during in event_ids(state), timeout=30)
        wait_until(
            lambda: any(
                r["kind"] == "notice" and r["notice"] in ("db_locked", "storage_fault")
                for r in audit_records(state)
            ),
            timeout=30,
            what="one notice for the locked store",
        )
        assert proc.poll() is None
    assert Counter(event_ids(state)) == Counter([first, during])


@pytest.mark.parametrize(
    ("fault", "cause"),
    [("no_database", "no such database"), ("refused", "database refused the login")],
)
def test_a_missing_database_or_refused_login_exits_2_with_one_line_and_no_password(
    emu: NtfyEmulator, tmp_path: Path, fault: str, cause: str
) -> None:
    """Failure mode: a typo in the DSN becomes a restart loop (exit 1, systemd restarts it
    forever) or a traceback, or the password ends up in the journal."""
    assert harness.DATABASE is not None
    parts = urlsplit(harness.DATABASE)
    if fault == "no_database":
        dsn = urlunsplit(parts._replace(path="/no_such_database_here"))
    else:
        # A role that does not exist is refused at login like a wrong password.
        netloc = f"nobody_here:hunter2@{parts.netloc.rsplit('@', 1)[-1]}"
        dsn = urlunsplit(parts._replace(netloc=netloc))
    env = env_for(emu.url, tmp_path / "state")
    env["NTFY_INTAKE_STATE_DATABASE"] = dsn
    with daemon_process(env) as proc:
        assert proc.wait(timeout=60) == 2
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert cause in lines[0] and "127.0.0.1" in lines[0]
    assert "hunter2" not in stderr and "Traceback" not in stderr


def test_every_session_has_tcp_keepalives_and_a_user_timeout_unless_the_dsn_names_its_own() -> None:
    """Failure mode: a network that stops delivering mid-statement (no RST, no FIN) hangs the
    daemon's session for the kernel's two hours, and a leader cut off from PostgreSQL sits in
    limbo that long, neither acting nor standing by. (A loopback proxy cannot drop packets, so
    the timeout itself is the kernel's to prove; what is ours is that every session asks.)"""
    assert harness.DATABASE is not None
    default = db.connect(harness.DATABASE)
    try:
        params = default.raw.info.get_parameters()
        assert params["tcp_user_timeout"] == "30000"
        assert (params["keepalives"], params["keepalives_idle"]) == ("1", "10")
    finally:
        default.close()
    sep = "&" if "?" in harness.DATABASE else "?"
    own = db.connect(f"{harness.DATABASE}{sep}tcp_user_timeout=45000")
    try:
        assert own.raw.info.get_parameters()["tcp_user_timeout"] == "45000"  # the DSN's wins
    finally:
        own.close()
