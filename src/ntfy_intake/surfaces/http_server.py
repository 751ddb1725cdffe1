"""uvicorn's server as the daemon runs it: no signal handlers of its own, and no 100 ms tick.

uvicorn's `main_loop` wakes ten times a second (issue 36: an idle daemon's largest share of
wake-ups once its own ticker sleeps until something is due) for three things: the exit flag,
the `Date` header refreshed once a second, and `timeout_notify`/`limit_max_requests`, which the
daemon does not use. Here the exit flag wakes an event when set, and the `Date` header is made
when a request reads the default headers (once per second at most), so nothing ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Generator
from email.utils import formatdate

import uvicorn
from uvicorn.server import ServerState


class _DatedState(ServerState):
    """uvicorn's shared server state whose default headers carry a `Date` read when a request
    begins (uvicorn's protocol reads them then), not refreshed by a tick."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__()
        self._config = config
        self._second = -1
        self._headers: list[tuple[bytes, bytes]] = []

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        now = time.time()
        if int(now) != self._second:
            self._second = int(now)
            date = [(b"date", formatdate(now, usegmt=True).encode())]
            self._headers = (
                date if self._config.date_header else []
            ) + self._config.encoded_headers
        return self._headers

    @default_headers.setter
    def default_headers(self, value: list[tuple[bytes, bytes]]) -> None:
        """uvicorn's own assignments (its __init__, a tick) are ignored: made on reading."""


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers (the daemon owns SIGINT/SIGTERM) and without its
    main loop's 100 ms poll of `should_exit`: setting it wakes the loop instead."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)
        self.server_state = _DatedState(config)

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def main_loop(self) -> None:
        await self._exit.wait()
