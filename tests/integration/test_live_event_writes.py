"""What one live event costs the store (issue 36 part 2): counted through the store's own
connection, not timed. On an SD card every commit is an fsync and every transaction dirties
pages of its own; the figures these bounds come from are in docs/performance.md ("Per live
event: bytes and CPU")."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.store import db
from ntfy_intake.testbed.emulator import NtfyEmulator

from ..harness import DaemonThread, event_ids, settings_for, wait_until

EVENTS = 10
RATE = 5.0  # live events a second, the footprint bench's


class StoreCounts:
    """Write transactions and durable (fsynced) commits on one SQLite connection."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._relaxed = False
        self._lock = threading.Lock()

    def __call__(self, statement: str) -> None:
        text = statement.strip().upper()
        with self._lock:
            if text.startswith("PRAGMA SYNCHRONOUS"):
                self._relaxed = text.endswith("NORMAL")
            elif text.startswith("BEGIN"):
                self.counts["transactions"] += 1
            elif text == "COMMIT" and not self._relaxed:
                self.counts["durable commits"] += 1


@contextlib.contextmanager
def settled_daemon(emu: NtfyEmulator, tmp_path: Path) -> Iterator[Daemon]:
    """A daemon on SQLite (what these tests count is SQLite's), its start-up poll and the
    writes it owed settled."""
    config = settings_for(emu.url, tmp_path, ntfy_keepalive_interval="45s")
    with DaemonThread(config) as running:
        daemon = running.daemon
        assert daemon is not None
        emu.wait_for_subscribers(1)
        if db.is_postgres(daemon.conn):
            pytest.skip(
                "counts what SQLite writes; PostgreSQL's rides are counted in its own tests"
            )
        wait_until(lambda: daemon.counters.extra.get("backfills", 0) >= 1, what="start-up poll")
        wait_until(lambda: db.owed_since(daemon.conn) is None, what="start-up writes settled")
        yield daemon


@contextlib.contextmanager
def counted(daemon: Daemon) -> Iterator[StoreCounts]:
    """The transactions and durable commits on the daemon's connection meanwhile."""
    counts = StoreCounts()
    daemon.conn.set_trace_callback(counts)  # type: ignore[attr-defined]
    try:
        yield counts
    finally:
        daemon.conn.set_trace_callback(None)  # type: ignore[attr-defined]


@pytest.mark.emulator(keepalive_interval=45.0)  # ntfy's: the frame time is saved on events
def test_a_live_event_costs_one_write_transaction_not_two(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Kills the transactions of their own that came with each live event besides its batch's:
    the audit mark's (after every batch), the health snapshot's (it changes with every event, so
    it was stored after nearly every one, with an fsync) and the last frame time's. They now
    ride the next write transaction. Before: 33 transactions for 10 events (10 batches, 10
    marks, 9 snapshots, 2 cursors, 2 frame times); after: the batches, the cursor's once a
    second, and one owed write at the end."""
    with settled_daemon(emu, tmp_path) as daemon:
        batches, cursors = daemon.counters.batches, daemon.counters.cursor_moves
        with counted(daemon) as counts:
            start = time.monotonic()
            ids = []
            for i in range(EVENTS):
                time.sleep(max(0.0, start + i / RATE - time.monotonic()))
                ids.append(emu.publish("alerts", f"disk full {i}", title="disk full")["id"])
            wait_until(lambda: set(ids) <= set(event_ids(tmp_path)), what="events recorded")
            # What the events leave owed (the mark, the snapshot, the frame time), written by
            # the ticker in one transaction once no batch came to carry it.
            wait_until(lambda: db.owed_since(daemon.conn) is None, what="owed writes")
        batches = daemon.counters.batches - batches
        cursors = daemon.counters.cursor_moves - cursors
    assert 1 <= batches <= EVENTS
    others = counts.counts["transactions"] - batches - cursors
    assert others <= 2, (dict(counts.counts), batches, cursors)
    assert counts.counts["durable commits"] <= batches + cursors + 2


def _wal_frames(wal: Path) -> int:
    """Frames in a WAL file since its last reset: those whose salt is the header's."""
    data = wal.read_bytes()
    if len(data) < 32:
        return 0
    page = int.from_bytes(data[8:12], "big")
    salt, offset, frames = data[16:24], 32, 0
    while offset + 24 + page <= len(data) and data[offset + 8 : offset + 16] == salt:
        frames, offset = frames + 1, offset + 24 + page
    return frames


@pytest.mark.emulator(keepalive_interval=45.0)
def test_a_live_event_writes_a_few_small_pages_not_a_dozen_large_ones(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Kills what an SD card was given per live event: about 13 WAL frames of 4 KiB (53 KiB,
    3.9x the floor of one INSERT and an audit line). Each B-tree a batch touches is a frame:
    two indexes written for rare reads, the outbox links' table and index of one key, the audit
    mark in every batch; and each frame was a 4 KiB page for rows of a few hundred bytes. Read
    from the WAL itself, checkpoints kept out: the bytes the events' commits appended."""
    with settled_daemon(emu, tmp_path) as daemon:
        path = Path(daemon.conn.execute("PRAGMA database_list").fetchone()[2])
        page = daemon.conn.execute("PRAGMA page_size").fetchone()[0]
        probe = db.connect(path)
        try:
            # The WAL emptied, so every frame counted below is the events'.
            wait_until(
                lambda: probe.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0,
                what="WAL reset",
            )
        finally:
            probe.close()
        start = time.monotonic()
        ids = []
        for i in range(EVENTS):
            time.sleep(max(0.0, start + i / RATE - time.monotonic()))
            ids.append(emu.publish("alerts", f"disk full {i}", title="disk full")["id"])
        wait_until(lambda: set(ids) <= set(event_ids(tmp_path)), what="events recorded")
        wait_until(lambda: db.owed_since(daemon.conn) is None, what="owed writes")
        frames = _wal_frames(Path(f"{path}-wal"))
    per_event = frames * (page + 24) / EVENTS
    assert frames >= EVENTS  # each event's batch committed at least its inbox row
    assert per_event <= 28 * 1024, (frames, page)


@pytest.mark.emulator(keepalive_interval=45.0)
def test_an_alert_alone_costs_one_fsync_of_the_store_not_two(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Kills the second fsync a lone alert (a homelab's usual rate: one every few minutes) cost
    the store: its batch's COMMIT, then, once its reorder window had passed, the cursor's save
    in a transaction of its own, fsynced too. The cursor only ever lags safely (a restart
    resumes earlier, and the inbox absorbs what is read again), so it rides the next write
    like the audit mark: the ticker writes it unsynced when no batch comes."""
    with settled_daemon(emu, tmp_path) as daemon:
        batches, cursors = daemon.counters.batches, daemon.counters.cursor_moves
        with counted(daemon) as counts:
            event_id = emu.publish("alerts", "disk full", title="disk full")["id"]
            wait_until(lambda: event_id in event_ids(tmp_path), what="the alert recorded")
            wait_until(lambda: daemon.counters.cursor_moves > cursors, what="the cursor settled")
            wait_until(lambda: db.owed_since(daemon.conn) is None, what="owed writes")
        assert daemon.counters.batches - batches == 1
        saved = daemon.conn.execute("SELECT value FROM cursor WHERE id = 1").fetchone()
    assert counts.counts["durable commits"] == 1, dict(counts.counts)
    assert saved is not None and saved[0] == event_id  # the cursor did reach the store
