"""One subscribe request as the hub sees it, and the control signals on its queue.

Kept apart from the hub so that the fault switches (faults.py), which route live deliveries to
streams, need not import the hub that owns them.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

from ntfy_intake.emulator.params import QueryFilter
from ntfy_intake.emulator.wire import Event


class Signal(enum.Enum):
    """Control items on a stream's queue, next to the encoded frames."""

    END = "end"  # a poll has written its replay: complete the response
    CLOSE = "close"  # graceful drop: complete the response now
    DROP = "drop"  # abort the connection
    DISCONNECTED = "disconnected"  # the client went away


class Stream:
    """One subscribe request (a stream or a poll) as the hub sees it. Loop-thread methods only,
    except `zombie` and `closed`, which are plain flags."""

    def __init__(
        self,
        *,
        topics: list[str],
        topics_str: str,
        filters: QueryFilter,
        poll: bool,
        encode: Callable[[Event], bytes | str],
        scheduled: bool = False,
    ) -> None:
        self.topics = topics
        self.topics_str = topics_str
        self.filters = filters
        self.poll = poll
        self.encode = encode
        self.scheduled = scheduled
        self.queue: asyncio.Queue[bytes | str | Signal] = asyncio.Queue()
        self.zombie = False
        self.closed = False
        self.live_seen = asyncio.Event()

    def deliver(self, event: Event) -> None:
        if not self.closed and self.filters.passes(event.to_dict()):
            self.queue.put_nowait(self.encode(event))

    def deliver_live(self, event: Event) -> None:
        self.deliver(event)
        self.live_seen.set()

    def signal(self, signal: Signal) -> None:
        self.queue.put_nowait(signal)
