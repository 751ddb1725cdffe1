"""The writes owed to the next PostgreSQL transaction (store/transaction.py `ride`), read from the
event loop (`owed_since`, the ticker's) while the worker thread adds and drops them."""

from __future__ import annotations

import sys
import threading

from ntfy_intake.store import postgres, transaction


def test_owed_since_read_while_the_worker_thread_changes_the_riders_never_raises() -> None:
    """Kills the ticker dying of "dictionary changed size during iteration": it looked at the
    riders while a commit dropped them in the worker thread."""
    conn = object.__new__(postgres.PgConnection)  # only its riders are used
    conn.riders = {}
    stop = threading.Event()

    def worker() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            transaction.ride(conn, f"mark{n % 64}", "SELECT 1", ())
            if n % 3 == 0:
                conn.riders.pop(f"mark{(n * 7) % 64}", None)

    found: list[float | None] = []
    errors: list[BaseException] = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch between any two bytecodes, near enough
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        for _ in range(20_000):
            try:
                found.append(transaction.owed_since(conn))
            except RuntimeError as exc:
                errors.append(exc)
                break
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(switch)
    assert errors == []
    assert any(since is not None for since in found)
