"""Start-up memory: a library only one mode uses is not resident in every daemon (peak RSS < 80 MB,
issue 36; the figures in docs/performance.md, Memory)."""

from __future__ import annotations

import subprocess
import sys

DAEMON_IMPORTS = "import ntfy_intake.cli, ntfy_intake.runtime.daemon, ntfy_intake.flow.intake"


def loaded_after(code: str, modules: tuple[str, ...]) -> list[str]:
    probe = f"{code}; import sys; print(' '.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_a_daemon_without_websocket_replies_does_not_load_websockets() -> None:
    """Failure mode: websockets' 23 modules (~0.8 MiB resident) in every daemon, loaded at import
    by flow/owner_replies.py for the websocket receive mode that few configure."""
    if loaded_after("import websockets.asyncio.client", ("websockets",)) != ["websockets"]:
        raise AssertionError("precondition: the probe sees websockets when it is imported")
    assert loaded_after(DAEMON_IMPORTS, ("websockets",)) == []


def test_a_sqlite_daemon_does_not_load_the_postgresql_driver() -> None:
    """Failure mode: psycopg (libpq and its libraries, 113 modules: ~10 MB of peak RSS, 61 ms of
    start-up) loaded at import by store/postgres.py in every process, a SQLite daemon's too
    (37536c0). It loads when a DSN is opened (postgres.load_driver)."""
    if loaded_after("import psycopg", ("psycopg",)) != ["psycopg"]:
        raise AssertionError("precondition: the probe sees psycopg when it is imported")
    assert loaded_after(DAEMON_IMPORTS, ("psycopg",)) == []
    opened = "from ntfy_intake.store import postgres; postgres.load_driver()"
    assert loaded_after(opened, ("psycopg",)) == ["psycopg"]
