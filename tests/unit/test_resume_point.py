from __future__ import annotations

from ntfy_intake.store.cursor import Cursor, ResumePoint


def test_cursor_waits_out_the_reorder_window() -> None:
    rp = ResumePoint(reorder_window=5.0)
    rp.durable("aaaaaaaaaaaa", 100, cached=True, read_at=10.0, generation=0)
    assert rp.settle(14.9) is None
    assert rp.settle(15.0) == Cursor.at_id("aaaaaaaaaaaa", 100)


def test_cursor_moves_in_delivery_order_to_the_newest_settled_event() -> None:
    rp = ResumePoint(reorder_window=1.0)
    rp.durable("bbbbbbbbbbbb", 101, cached=True, read_at=10.0, generation=0)
    rp.durable("aaaaaaaaaaaa", 100, cached=True, read_at=10.5, generation=0)
    rp.durable("cccccccccccc", 102, cached=True, read_at=12.0, generation=0)
    assert rp.settle(11.6) == Cursor.at_id("aaaaaaaaaaaa", 100)
    assert rp.settle(12.5) is None
    assert rp.settle(13.0) == Cursor.at_id("cccccccccccc", 102)


def test_uncached_message_never_becomes_the_cursor() -> None:
    rp = ResumePoint(reorder_window=0.0)
    rp.durable("aaaaaaaaaaaa", 100, cached=True, read_at=1.0, generation=0)
    rp.durable("nocache12345", 101, cached=False, read_at=1.0, generation=0)
    assert rp.settle(2.0) == Cursor.at_id("aaaaaaaaaaaa", 100)


def test_events_of_a_lost_connection_never_settle() -> None:
    rp = ResumePoint(reorder_window=1.0)
    rp.durable("aaaaaaaaaaaa", 100, cached=True, read_at=1.0, generation=0)
    generation = rp.connection_lost()
    rp.durable("bbbbbbbbbbbb", 101, cached=True, read_at=1.0, generation=0)  # old connection, late
    assert rp.settle(10.0) is None
    rp.durable("cccccccccccc", 102, cached=True, read_at=2.0, generation=generation)
    assert rp.settle(10.0) == Cursor.at_id("cccccccccccc", 102)
