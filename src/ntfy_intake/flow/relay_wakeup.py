"""The relay's wake-up, and the claim it offers to the trip that releases a request.

`Wakeup` is the asyncio.Event the relay waits on between its turns. `set()` (the writer released
a request, a redrive, the daemon stopping) says rows may be due: the relay looks for them.
`poke()` only wakes it (an attempt finished: there is something to settle, nothing new to claim),
so a finished delivery does not cost a claim that finds nothing.

While the relay holds nothing claimed (waiting, or writing its last settle's audit lines), it
offers its claim (`Offers.make`). The writer's trip whose transaction released requests takes it
(`claim_in_trip`, in the worker thread, right after that COMMIT and before the audit flush, under
the database lock the trip holds): the claim runs there, so the POST goes out while the audit
line is written and the relay does not queue for the lock behind that flush. At most one trip
takes an offer; the relay withdraws it before it claims itself or when it wakes, and learns
whether it was taken: its claims then reach it through the event loop, and until they have
(`Offers.coming`) it neither claims nor offers again. Every method but `claim_in_trip` runs on
the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Wakeup(asyncio.Event):
    """The relay's wake-up and its offered claim (module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self._asked = False  # set() since the relay last looked
        self._lock = threading.Lock()  # the offer is taken in the worker thread
        self._offer: Callable[[], None] | None = None
        self._taken = False

    def set(self) -> None:
        """Rows may be due: wake the relay, and have it look."""
        self._asked = True
        super().set()

    def poke(self) -> None:
        """Wake the relay without asking it to look for rows."""
        super().set()

    def take_asked(self) -> bool:
        """Whether `set()` was called since the last call (cleared by asking)."""
        asked, self._asked = self._asked, False
        return asked

    def offer(self, claim: Callable[[], None]) -> None:
        with self._lock:
            self._offer, self._taken = claim, False

    def withdraw(self) -> bool:
        """No longer offered; whether a trip took the offer since it was made."""
        with self._lock:
            taken, self._offer, self._taken = self._taken, None, False
        return taken

    def claim_in_trip(self) -> bool:
        """In the worker thread, inside a trip whose transaction has just released requests:
        run the relay's offered claim here. False when none was offered (the caller wakes the
        relay instead)."""
        with self._lock:
            claim, self._offer = self._offer, None
            if claim is None:
                return False
            self._taken = True
        claim()
        return True


def asked(wakeup: asyncio.Event) -> bool:
    """Whether the relay should look for rows now that `wakeup` woke it (a plain Event, as a
    test may give it, always asks)."""
    return wakeup.take_asked() if isinstance(wakeup, Wakeup) else True


def poke(wakeup: asyncio.Event) -> None:
    if isinstance(wakeup, Wakeup):
        wakeup.poke()
    else:
        wakeup.set()


def claim_in_trip(wakeup: asyncio.Event) -> bool:
    return isinstance(wakeup, Wakeup) and wakeup.claim_in_trip()


class Offers(Generic[T]):
    """The relay's side of its offered claims (module doc), on the event loop: at most one out
    at a time, numbered, and whether a taken one's claims are still on their way."""

    def __init__(self) -> None:
        self._made = self._taken = self._come = 0
        self._out: Wakeup | None = None

    @property
    def coming(self) -> bool:
        return self._taken > self._come

    def make(
        self,
        wakeup: asyncio.Event,
        loop: asyncio.AbstractEventLoop,
        claim: Callable[[], T],
        adopt: Callable[[T], None],
    ) -> None:
        """Offer `claim` through `wakeup` (run in the taking trip's thread; what it returns goes
        to `adopt` on `loop`), unless one is out or coming, or `wakeup` is a plain Event."""
        if not isinstance(wakeup, Wakeup) or self._out is not None or self.coming:
            return
        self._made += 1
        number = self._made

        def run() -> None:
            try:
                result = claim()
            except BaseException:
                loop.call_soon_threadsafe(self._lost, number, wakeup)
                raise
            loop.call_soon_threadsafe(self._arrived, number, adopt, result)

        wakeup.offer(run)
        self._out = wakeup

    def withdraw(self) -> None:
        out, self._out = self._out, None
        if out is not None and out.withdraw():
            self._taken = self._made

    def _arrived(self, number: int, adopt: Callable[[T], None], result: T) -> None:
        self._done(number)
        adopt(result)

    def _lost(self, number: int, wakeup: Wakeup) -> None:
        """The taking trip's claim raised (the trip fails with it): nothing is coming."""
        self._done(number)
        wakeup.set()

    def _done(self, number: int) -> None:
        self._taken = max(self._taken, number)
        self._come = max(self._come, number)
        if number == self._made:
            self._out = None  # taken and come: a new one may be made
