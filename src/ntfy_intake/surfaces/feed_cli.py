"""The core of ``ntfy-intake feed catch-up|ack|wait --handle H`` (docs/design.md section 7).

Each function opens the feed on the daemon's database file (it works whether or not the daemon
runs), prints JSON on stdout and returns the exit code; cli.py only parses arguments.

- ``catch_up``: the JSON array of unacked entries (ordered by channel then seq), exit 0; when
  triage requests are still in their debounce window (not in the feed yet), one note on stderr
  says how many and when the next is released, so an empty array is not mistaken for a fault;
- ``ack``: ``{"channel": C, "cursor": N}``, exit 0, also for a stale ack (unchanged cursor);
- ``wait``: ``{"wake_line": ...}`` and exit 0 on a ring, ``null`` and exit 1 on timeout.

Any refusal or failure (ack beyond head, a bad handle, a broken database) prints one line on
stderr and returns 2, with nothing on stdout. JSON is written ASCII-only, so untrusted alert text
in a payload cannot put a raw control or bidi character on the agent's terminal.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterator

from ntfy_intake.errors import IntakeError
from ntfy_intake.rules.sanitize import one_line
from ntfy_intake.store import db, summary
from ntfy_intake.store.doorbell import Doorbell
from ntfy_intake.store.feed import DEFAULT_CHANNEL, FeedStore, JoinAt

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_TIMEOUT", "ack", "catch_up", "wait"]

EXIT_OK = 0
EXIT_TIMEOUT = 1
EXIT_ERROR = 2


def _expected() -> tuple[type[Exception], ...]:
    return (IntakeError, *db.ERRORS, OSError, ValueError)  # db.ERRORS as it is now


class _Failed(Exception):
    pass


def _reported() -> tuple[type[Exception], ...]:
    return (_Failed, *_expected())


def _print(value: object) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=True, allow_nan=False) + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def _store(db_path: db.Target | str) -> Iterator[FeedStore]:
    try:
        store = FeedStore.open(db_path)
    except _expected() as exc:
        raise _Failed(str(exc)) from exc
    try:
        yield store
    finally:
        store.close()


def _run(body: Callable[[], int]) -> int:
    try:
        return body()
    except _reported() as exc:
        message = one_line(str(exc), 500) or type(exc).__name__
        sys.stderr.write(f"ntfy-intake feed: {message}\n")
        sys.stderr.flush()
        return EXIT_ERROR


def catch_up(
    db_path: db.Target | str, handle: str, *, channel: str | None = None, at: JoinAt = "head"
) -> int:
    """Print every unacked entry for `handle` as a JSON array; exit 0.

    The first call for a handle joins it (on `channel`, default ``triage``) at head, or at the
    start with ``at="start"``; an existing cursor never moves.
    """

    def body() -> int:
        with _store(db_path) as store:
            entries = store.catch_up(handle, channel=channel, at=at)
        _print([entry.to_json() for entry in entries])
        note = _debounce_note(db_path, time.time())
        if note is not None:
            sys.stderr.write(f"ntfy-intake feed: {note}\n")
        return EXIT_OK

    return _run(body)


def debounce_note(collecting: int, next_release_at: float | None, now: float) -> str | None:
    """Say that triage requests exist but wait in their debounce window; None when none do."""
    if collecting <= 0:
        return None
    when = ""
    if next_release_at is not None:
        when = f"; the next is released in {max(0.0, next_release_at - now):.0f} s"
    return (
        f"{collecting} triage request(s) still collecting in their debounce window "
        f"(cadence.debounce), not in the feed yet{when}"
    )


def _debounce_note(db_path: db.Target | str, now: float) -> str | None:
    found = summary.collecting_in(db_path)
    if found is None:
        return None  # a hint only: never fail the catch-up over it
    return debounce_note(*found, now)


def ack(db_path: db.Target | str, handle: str, channel: str, seq: int) -> int:
    """Move the handle's cursor on `channel` forward to `seq`; print the cursor; exit 0.

    A stale ack prints the unchanged cursor and exits 0; beyond head (or a channel the handle
    never joined) exits 2 with a message on stderr.
    """

    def body() -> int:
        with _store(db_path) as store:
            cursor = store.ack(handle, channel, seq)
        _print({"channel": channel, "cursor": cursor})
        return EXIT_OK

    return _run(body)


def wait(
    db_path: db.Target | str,
    handle: str,
    timeout: float,
    *,
    channel: str | None = None,
    at: JoinAt = "head",
) -> int:
    """Block until the handle's doorbell rings (exit 0) or `timeout` seconds pass (exit 1).

    Peek-only: it prints the sanitized wake line, never an entry's content, and consumes nothing.
    A handle without cursors joins (`channel`, default ``triage``) first, at head unless
    ``at="start"``, so whatever rings is still there for the catch-up that follows.
    """

    def body() -> int:
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout >= 0):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
        with _store(db_path) as store:
            if channel is not None:
                store.subscribe(handle, channel, at=at)
            elif not store.cursors(handle):
                store.subscribe(handle, DEFAULT_CHANNEL, at=at)
            bell = Doorbell(store, handle, channels=None if channel is None else [channel])
            event = bell.wait(timeout)
        if event is None:
            _print(None)
            return EXIT_TIMEOUT
        _print({"wake_line": event.wake_line})
        return EXIT_OK

    return _run(body)
