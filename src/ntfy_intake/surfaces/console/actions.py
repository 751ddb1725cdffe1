"""What the console (and `silence` over HTTP) may change: silences and redrives, done by the
daemon's own writer.

Each action is one write transaction run through the daemon's `run` (its database lock and its
transient-fault retry), then an audit flush. A silence is an audit record and nothing else; the
live cadence folds it after COMMIT (`OwnerQueue.silence`), a restart folds it again from the log.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ntfy_intake.rules import silences
from ntfy_intake.store import db, outbox
from ntfy_intake.store.owner_queue import OwnerQueue

T = TypeVar("T")
Run = Callable[..., Awaitable[Any]]
"""The daemon's `_db`: `await run(fn, *args)` runs `fn(*args)` in its worker thread."""


class Actions:
    def __init__(
        self,
        *,
        run: Run,
        conn: Callable[[], db.Connection],
        queue: OwnerQueue,
        flush: Callable[[], Awaitable[object]],
        wake_relay: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        self._run = run
        self._conn = conn
        self._queue = queue
        self._flush = flush
        self._wake_relay = wake_relay
        self._clock = clock

    def active(self) -> list[silences.Silence]:
        """The silences holding now, as the last COMMIT left them (`OwnerQueue.view`: this
        runs on the event loop, the live state is the database thread's)."""
        return self._queue.view.silences.active(self._clock())

    async def add_silence(
        self, scope: str, target: str, span: float, reason: str = ""
    ) -> silences.Silence:
        """Raises `silences.SilenceError` for a bad field (nothing written)."""
        checked_scope, checked_target, checked_reason = silences.check(scope, target, reason)
        silence_id = "sil_" + secrets.token_hex(6)

        def write() -> None:
            now = self._clock()
            fields = silences.silence_fields(
                silence_id, checked_scope, checked_target, now + span, checked_reason
            )
            with db.write_txn(self._conn()) as txn:
                self._queue.silence(txn, "silence", now, **fields)

        await self._run(write)
        await self._flush()
        made = self._queue.view.silences.get(silence_id)  # published after the COMMIT
        assert made is not None
        return made

    async def end_silence(self, silence_id: str) -> bool:
        """End a silence that holds now; False when no such silence holds."""
        if not silences.valid_id(silence_id):
            return False

        def write() -> bool:
            now = self._clock()
            found = self._queue.state.silences.get(silence_id)
            if found is None or not found.holds(now):
                return False
            with db.write_txn(self._conn()) as txn:
                self._queue.silence(txn, "silence_end", now, silence_id=silence_id)
            return True

        ended = bool(await self._run(write))
        if ended:
            await self._flush()
        return ended

    async def redrive(self, keys: list[str] | None) -> list[str]:
        """Dead rows back in the relay queue (all when `keys` is None), under the same keys."""
        done: list[str] = await self._run(lambda: outbox.redrive(self._conn(), keys, self._clock()))
        await self._flush()
        if done:
            self._wake_relay()
        return done
