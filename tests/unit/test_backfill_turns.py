"""A backfill poll's lines are decoded a few turns of the event loop at a time.

The poll of a reconnect during a storm returns hundreds of lines; decoding them in one go held
every live frame read meanwhile (230 lines: 4 ms on the test box, the live event's whole budget
being 15 ms). Named after the failure it kills.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import httpx
import pytest

from ntfy_intake.flow import intake
from ntfy_intake.store.cursor import Cursor, Owed, Resume
from ntfy_intake.wire import frames


def _line(n: int) -> bytes:
    frame = {"id": f"bf{n:010d}", "time": 1_764_470_000, "event": "message", "topic": "alerts"}
    return json.dumps({**frame, "message": f"backfilled {n}"}).encode()


def test_backfill_decode_holds_no_live_frame_back_for_the_whole_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [_line(n) for n in range(10 * intake.DECODE_TURN)]
    decoded = {"n": 0}
    real_decode = frames.decode_line

    def counting(line: bytes, topics: Any) -> Any:
        decoded["n"] += 1
        return real_decode(line, topics)

    monkeypatch.setattr(frames, "decode_line", counting)
    items: list[intake.Item] = []
    seen_at: list[int] = []

    async def scenario() -> None:
        async def resume() -> Resume:
            raise AssertionError("not asked")

        async def never(*args: Any) -> Any:
            raise AssertionError("not asked")

        async with httpx.AsyncClient() as client:
            reader = intake.Intake(
                intake.IntakeConfig("http://127.0.0.1:9", ("alerts",), None, 30.0, cache_settle=0),
                client,
                sink=items.append,
                current_resume=resume,
                on_rejected_cursor=never,
                owe_backfill=never,
                new_generation=itertools.count().__next__,
                health=intake.IntakeHealth(),
            )

            async def poll(since: int) -> list[bytes]:
                return lines

            monkeypatch.setattr(reader, "_poll", poll)
            backfill = asyncio.create_task(
                reader._backfill(Cursor("all", "all"), Owed(0, 0, None), 0)
            )
            while not backfill.done():  # a live frame's turn, as often as the loop gives one
                seen_at.append(decoded["n"])
                await asyncio.sleep(0)
            await backfill

    asyncio.run(scenario())
    assert decoded["n"] == len(lines)
    during = [n for n in seen_at if 0 < n < len(lines)]
    assert len(during) >= 8, seen_at  # before: no turn between the first line and the last
    [backfilled] = items
    assert isinstance(backfilled, intake.Backfilled) and len(backfilled.events) == len(lines)
