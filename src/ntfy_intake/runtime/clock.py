"""The daemon's wall clock, checked against the ntfy server's: a local clock jump never moves
cadence windows, the daily cap, retention or audit file days.

The rule (DESIGN.md sections 3 and 4): the local clock is trusted while it agrees with the
server's time within `BOUND` (5 minutes). The server's time is the `Date` header of its most
recent response (the stream's headers arrive before any frame, so every recorded event has one),
carried forward on the monotonic clock, which no wall-clock step moves. When the two disagree
by more than the bound, the server's time is used instead, the jump is logged and noticed once,
and the local clock is trusted again as soon as it agrees (NTP stepped it back, or a Pi without
a real-time clock finally synced). Before any server response the local clock is all there is.

Why 5 minutes: far above NTP's slew and ntfy's one-second time resolution, and well below the
shortest window it protects (the default debounce is 2 minutes of wall time; the cooldown is an
hour, a day is a day). A clock that drifts less than that is not a jump.

Pure apart from the clocks it is given.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from pathlib import Path

BOUND = 300.0


class TrustedClock:
    def __init__(
        self,
        local: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        bound: float = BOUND,
    ) -> None:
        self.local = local
        self.monotonic = monotonic
        self.bound = bound
        self._server: tuple[float, float] | None = None  # (server time, monotonic then)
        self._jumped = False
        self._switched = False  # the source changed and time has not yet passed the last reading
        self._last: float | None = None
        self.jumps = 0
        self._pending: list[str] = []

    def observe_server(self, server_time: float, at_monotonic: float | None = None) -> None:
        """A fresh server time (a response's `Date`), read at `at_monotonic`."""
        self._server = (server_time, self.monotonic() if at_monotonic is None else at_monotonic)

    def observe_date_header(self, value: str | None) -> None:
        if not value:
            return
        try:
            self.observe_server(parsedate_to_datetime(value).timestamp())
        except (TypeError, ValueError, IndexError, OverflowError):
            return  # a server with a broken Date header is judged by the local clock alone

    def server_now(self) -> float | None:
        if self._server is None:
            return None
        server_time, at = self._server
        return server_time + (self.monotonic() - at)

    def __call__(self) -> float:
        now = self._choose()
        if (
            self._last is not None
            and self._switched
            and self._last - self.bound <= now < self._last
        ):
            # Switching between two sources that agree within the bound must not step time back
            # (the `Date` header has one-second resolution): hold until time passes the last
            # reading. A larger step back is a correction of a wrong reading: taken at once.
            return self._last
        self._switched = False
        self._last = now
        return now

    def _choose(self) -> float:
        local = self.local()
        server = self.server_now()
        if server is None or abs(local - server) <= self.bound:
            if self._jumped:
                self._switched = True
            self._jumped = False
            return local
        if not self._jumped:
            self._switched = True
            self._jumped = True
            self.jumps += 1
            self._pending.append(
                f"local clock {'ahead of' if local > server else 'behind'} the ntfy server by "
                f"{_span(abs(local - server))}"
            )
        return server

    def take_jumps(self) -> list[str]:
        """Descriptions of the jumps found since the last call (each is noticed once)."""
        taken, self._pending = self._pending, []
        return taken


def _span(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds:.0f} s"


TEST_OFFSET_ENV = "NTFY_INTAKE_TEST_CLOCK_OFFSET_FILE"


def from_environ(env: dict[str, str] | None = None) -> Callable[[], float]:
    """The local clock; under the storage drill (`NTFY_INTAKE_TEST_CLOCK_OFFSET_FILE`, a test
    hook, never set in production) the system clock plus the seconds in that file, so the drill
    can jump the daemon's clock without touching the machine's."""
    path = (os.environ if env is None else env).get(TEST_OFFSET_ENV)
    if not path:
        return time.time
    return _OffsetClock(Path(path))


class _OffsetClock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0.0
        self._read_at = -1.0

    def __call__(self) -> float:
        now = time.monotonic()
        if now - self._read_at > 0.05:
            self._read_at = now
            # A file being rewritten keeps the last offset.
            with contextlib.suppress(OSError, ValueError):
                self._offset = float(self.path.read_text().strip() or 0)
        return time.time() + self._offset
