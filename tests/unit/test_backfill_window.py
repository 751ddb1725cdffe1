"""Pure arithmetic of the overlap backfill and the gap window (cursor.py), and the sequence
joins of the inbox transaction."""

from __future__ import annotations

import json
import sqlite3

from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.store import inbox
from ntfy_intake.store.cursor import Cursor, backfill_since, gap_window
from ntfy_intake.wire.frames import Message, decode_line

from ..conftest import TOPICS, owner_queue

HOUR = 3600


def test_backfill_reaches_behind_the_older_of_cursor_and_open_by_the_overlap() -> None:
    assert backfill_since(Cursor.at_id("abcDEF123456", 1000), 5000, 30) == 970
    assert backfill_since(Cursor.at_id("abcDEF123456", 9000), 5000, 30) == 4970  # skewed clock
    assert backfill_since(Cursor.at_time(2000), 5000, 30) == 1970  # first start's join time
    assert backfill_since(Cursor.everything(), 5000, 30) == 4970


def test_quiet_homelab_whose_cursor_expired_while_connected_has_an_empty_window() -> None:
    last_keepalive = 100 * HOUR
    assert gap_window(last_keepalive, last_keepalive + 60, [], 12 * HOUR) is None
    # Something published during the reconnect is still held: nothing before it can be gone.
    assert (
        gap_window(last_keepalive, last_keepalive + 60, [(last_keepalive + 30, None)], 12 * HOUR)
        is None
    )


def test_gap_window_ends_where_the_server_must_still_hold_everything() -> None:
    down_at, back_at = 0, 20 * HOUR
    assert gap_window(down_at, back_at, [], 12 * HOUR) == (0, 8 * HOUR)
    oldest = (5 * HOUR, 5 * HOUR + 12 * HOUR)
    assert gap_window(down_at, back_at, [oldest], 12 * HOUR) == (0, 5 * HOUR)


def test_a_server_with_a_shorter_cache_than_configured_cannot_hide_a_loss() -> None:
    # The daemon thinks 12 h, the messages say 1 h: the window follows the server.
    held = [(19 * HOUR + 1800, 20 * HOUR + 1800)]
    assert gap_window(0, 20 * HOUR, held, 12 * HOUR) == (0, 19 * HOUR)


def test_server_that_lost_its_cache_reports_the_window_up_to_what_it_still_holds() -> None:
    """ntfy restarted without its cache file: the cursor message was 10 minutes old, so a
    healthy server would still hold it; what it holds now starts with a message 5 s ago."""
    cursor_time, last_frame, opened = 100 * HOUR, 100 * HOUR + 60, 100 * HOUR + 600
    after = (opened - 5, opened - 5 + 12 * HOUR)
    assert gap_window(last_frame, opened, [after], 12 * HOUR, cursor_time) == (
        last_frame,
        opened - 5,
    )
    assert gap_window(last_frame, opened, [], 12 * HOUR, cursor_time) == (last_frame, opened)
    # The same server, but the cursor message had expired normally: nothing can be gone.
    assert gap_window(last_frame, opened, [after], 12 * HOUR, cursor_time - 13 * HOUR) is None


@given(
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.lists(st.tuples(st.integers(0, 10**6), st.none() | st.integers(0, 10**6)), max_size=5),
)
def test_gap_window_is_never_reversed_and_never_starts_before_the_last_frame(
    start: int, opened: int, held: list[tuple[int, int | None]]
) -> None:
    window = gap_window(start, opened, held, 43200)
    assert window is None or window[0] == start < window[1]


def message(event_id: str, title: str, sequence_id: str | None = None) -> Message:
    obj: dict[str, object] = {
        "id": event_id,
        "time": 1_764_470_000,
        "expires": 1_764_513_200,
        "event": "message",
        "topic": "alerts",
        "title": title,
        "message": "x",
    }
    if sequence_id:
        obj["sequence_id"] = sequence_id
    frame = decode_line(json.dumps(obj).encode(), TOPICS)
    assert isinstance(frame, Message)
    return frame


def test_update_that_arrives_before_its_original_still_shares_one_incident(
    store: sqlite3.Connection,
) -> None:
    queue = owner_queue()
    update = message("updateAAAAAA", "Backup FAILED", sequence_id="originalAAAA")
    original = message("originalAAAA", "Backup running")
    for frame in (update, original):
        inbox.record_batch(store, [frame], 1_764_470_100.0, queue=queue, relay_enabled=False)
    keys = [tuple(r) for r in store.execute("SELECT DISTINCT incident_key FROM inbox")]
    assert keys == [("alerts:backup failed",)]


def test_update_in_the_same_batch_as_its_original_joins_it(store: sqlite3.Connection) -> None:
    frames = [
        message("originalBBBB", "Disk warm"),
        message("updateBBBBBB", "Disk HOT", "originalBBBB"),
    ]
    inbox.record_batch(store, frames, 1_764_470_100.0, queue=owner_queue(), relay_enabled=False)
    assert [tuple(r) for r in store.execute("SELECT DISTINCT incident_key FROM inbox")] == [
        ("alerts:disk warm",)
    ]
