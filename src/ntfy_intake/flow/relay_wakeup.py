"""The relay's wakeup: one event its loop waits on, telling "rows may be due" from "an attempt
ended", so the turn that settles an ended attempt does not also claim (a write transaction that
would find nothing) unless something else asked it to look."""

from __future__ import annotations

import asyncio


class Wakeup(asyncio.Event):
    """The relay's wakeup. `set` (a release it was not handed, a redrive, a test): rows may be
    due, so the next turn claims. `settle` (an attempt ended): a turn settles it, and claims only
    if something else asked to look; an ended attempt makes nothing new due."""

    def __init__(self) -> None:
        super().__init__()
        self.look = False

    def set(self) -> None:
        self.look = True
        super().set()

    def settle(self) -> None:
        super().set()

    def clear(self) -> None:
        self.look = False
        super().clear()
