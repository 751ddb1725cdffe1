"""Every node keeps the whole audit log (DESIGN.md section 9): on PostgreSQL the journal is the
record, and every node, leader or standby, mirrors it in seq order into its own audit files,
each line carrying the term it was written under. Failure-mode tests are named after the
failure they kill; they run on PostgreSQL (NTFY_INTAKE_TEST_DATABASE), the SQLite line format
is held on SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.errors import AuditWriteError
from ntfy_intake.flow.database import Database, StorageWaits
from ntfy_intake.flow.journal import Journal
from ntfy_intake.flow.pipeline import CountedOwnerQueue, Counters, Heartbeat
from ntfy_intake.rules import cadence
from ntfy_intake.runtime import recovery
from ntfy_intake.store import (
    audit,
    audit_mirror,
    db,
    inbox,
    leadership,
    migrations,
    postgres,
    rebuild,
    rehydrate,
    retention,
)

from .. import harness
from ..conftest import make_message, owner_queue

PG = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
NOW = 1_764_470_100.0
DAY = 86400.0

Connect = Callable[..., postgres.PgConnection]


@pytest.fixture
def connect(engine: str) -> Iterator[Connect]:
    """Connections to this test's (migrated) schema, each closed after the test: one per node."""
    opened: list[postgres.PgConnection] = []

    def open_one(*, readonly: bool = False) -> postgres.PgConnection:
        conn = db.connect(db.Dsn(harness.DATABASE or ""), readonly=readonly)
        assert isinstance(conn, postgres.PgConnection)
        opened.append(conn)
        return conn

    migrations.apply(open_one())
    yield open_one
    for conn in opened:
        conn.close()


def record(conn: db.Connection, *ids: str, now: float = NOW, debounce: float = 60.0) -> None:
    """One batch of events (a new incident each); with a debounce, one journal row per event."""
    inbox.record_batch(
        conn,
        [make_message(i, title=i) for i in ids],
        now,
        queue=owner_queue(debounce=debounce),
        relay_enabled=True,
    )


def node(directory: Path) -> audit.AuditLog:
    """One node's audit log (a process's view of its files: a restart is a new one)."""
    return audit.AuditLog(directory, lambda: NOW)


def lead(conn: postgres.PgConnection, name: str) -> int:
    """`name` takes the lease (absent or expired) and fences `conn` to the term it won."""
    claimed = leadership.claim(conn, name, f"{name}-instance", 60.0)
    assert claimed.won, claimed
    conn.term = claimed.row.term
    return conn.term


def expire(conn: postgres.PgConnection) -> None:
    """The leader is gone (crashed, partitioned): its lease runs out."""
    conn.execute("UPDATE leadership SET expires_at = now() - INTERVAL '1 second'")


def lines(directory: Path) -> list[dict[str, Any]]:
    return list(audit.read_records(directory))


def seqs(directory: Path) -> list[int]:
    return [int(r["seq"]) for r in lines(directory)]


def journal(conn: db.Connection) -> list[tuple[int, int]]:
    """(seq, term) of every journal row."""
    return [
        (int(s), int(t))
        for s, t in conn.execute("SELECT seq, term FROM audit_journal ORDER BY seq")
    ]


def assert_mirrors(conn: db.Connection, *directories: Path) -> None:
    for directory in directories:
        assert audit_mirror.compare(conn, directory) is None, directory


# -- the line format -------------------------------------------------------------------------------


@pytest.mark.sqlite_only(reason="holds SQLite's line format; PostgreSQL's is held below")
def test_sqlite_audit_lines_are_unchanged_byte_for_byte(
    store: db.Connection, tmp_path: Path
) -> None:
    """Kills a term (or any new key) leaking into a one-box install's lines: they stay
    `{"v":1,"seq":N,` + the record, exactly as before the standby existed."""
    record(store, "aaaaaaaaaaa1")
    with node(tmp_path / "audit") as log:
        audit.flush(store, log)
    (path,) = audit.log_files(tmp_path / "audit")
    assert path.read_text() == (
        '{"v":1,"seq":1,"ts":"2025-11-30T02:35:00.000Z","kind":"event","event_id":"aaaaaaaaaaa1",'
        '"incident":"alerts:aaaaaaaaaaa1","severity":3,"status":"firing",'
        '"outcome":"triage_requested","reason":"new_incident","delivery_key":"tri_aaaaaaaaaaa1",'
        '"topic":"alerts","time":1764470000,"expires":1764513200,'
        '"sha256":"' + _sha256_of(store) + '"}\n'
    )


def _sha256_of(conn: db.Connection) -> str:
    (sha,) = conn.execute("SELECT raw_sha256 FROM inbox").fetchone()
    return str(sha)


@PG
def test_lines_carry_the_term_of_the_leader_that_wrote_them(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills a journal whose rows cannot say which leader wrote them: each row records the
    connection's term, and its line carries `"term"` right after `seq`; an unfenced writer
    (one daemon alone, term 0) writes the line as SQLite does."""
    alone = connect()
    record(alone, "aaaaaaaaaaa1")
    leader = connect()
    term = lead(leader, "pi-a")
    record(leader, "bbbbbbbbbbb2")
    with node(tmp_path / "audit") as log:
        audit.flush(leader, log)
    assert journal(leader) == [(1, 0), (2, term)]
    first, second = audit.log_files(tmp_path / "audit")[0].read_text().splitlines()
    assert first.startswith('{"v":1,"seq":1,"ts":')
    assert second.startswith(f'{{"v":1,"seq":2,"term":{term},"ts":')
    assert [r.get("term") for r in lines(tmp_path / "audit")] == [None, term]


@PG
def test_lines_with_a_term_fold_into_the_cadence_as_lines_without_one(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills a reader that trips over the new key: the start-up fold (rehydrate) of a standby's
    files, whose lines carry a term, gives the state the same records give without it."""
    leader = connect()
    lead(leader, "pi-a")
    record(leader, "aaaaaaaaaaa1", "bbbbbbbbbbb2")
    with node(tmp_path / "b") as log:
        audit.mirror(leader, log)
    plain = tmp_path / "plain"
    plain.mkdir()
    for path in audit.log_files(tmp_path / "b"):
        (plain / path.name).write_text(path.read_text().replace(',"term":1,', ","))
    policy = cadence.Policy(debounce=60.0)
    with_term = rehydrate.load(tmp_path / "b", policy, NOW)
    without = rehydrate.load(plain, policy, NOW)
    assert with_term.records == without.records == 2
    assert with_term.state.snapshot() == without.state.snapshot()
    assert len(with_term.state.snapshot()["incidents"]) == 2


@PG
def test_journal_row_staged_outside_the_write_lock_is_refused(connect: Connect) -> None:
    """Kills a row that commits out of seq order: staged in autocommit, outside the write lock,
    it could commit above a seq still in flight, and every mirror would pass that seq by."""
    conn = connect()
    with pytest.raises(RuntimeError, match="write_txn"):
        audit.stage(conn, "notice", NOW, notice="x")
    assert journal(conn) == []


# -- mirroring -------------------------------------------------------------------------------------


@PG
def test_standby_that_mirrors_after_the_leaders_flush_finds_every_row(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills the flush that pruned the journal up to its mark: a standby mirroring after the
    leader flushed found nothing, and its files stayed empty."""
    leader = connect()
    lead(leader, "pi-a")
    record(leader, "aaaaaaaaaaa1", "bbbbbbbbbbb2", "ccccccccccc3")
    with node(tmp_path / "a") as log:
        assert audit.flush(leader, log) == 3
    assert len(journal(leader)) == 3  # kept for the other nodes
    with node(tmp_path / "b") as log:
        assert audit.mirror(connect(readonly=True), log) == 3
    assert seqs(tmp_path / "b") == [1, 2, 3]


@PG
def test_two_nodes_mirroring_one_journal_end_equal_to_it_and_to_each_other(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills a mirror that skips, repeats or reorders rows while the leader keeps writing and
    flushing: the standby (read-only, small batches, a limit per call) and the leader end with
    the same lines as the journal."""
    leader = connect()
    standby = connect(readonly=True)
    lead(leader, "pi-a")
    with node(tmp_path / "a") as a, node(tmp_path / "b") as b:
        for batch in range(6):
            record(leader, *(f"e{batch:02d}{n:09d}" for n in range(batch + 1)))
            audit.flush(leader, a)
            audit.mirror(standby, b, limit=2, batch=1)  # lags behind on purpose
        while audit.mirror(standby, b, batch=4):
            pass
        assert audit.mirror(standby, b) == 0
    assert_mirrors(leader, tmp_path / "a", tmp_path / "b")
    assert lines(tmp_path / "a") == lines(tmp_path / "b")
    assert seqs(tmp_path / "a") == [seq for seq, _ in journal(leader)] == list(range(1, 22))


@PG
def test_mirror_killed_mid_append_resumes_without_a_line_twice_or_missing(
    connect: Connect, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills a mirror that, after a kill -9 halfway through a batch (a torn last line), glues
    the next line onto the fragment or starts again from the first row: the next start cuts the
    torn line and goes on after the last whole one."""
    leader = connect()
    record(leader, *(f"k{n:011d}" for n in range(5)))
    real_write = os.write
    calls = 0

    def killed_in_the_second_batch(fd: int, data: bytes) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            real_write(fd, data[: len(data) * 3 // 4])  # mid-line
            raise SystemExit("kill -9 mid-write")  # no cut-back: the process is gone
        return real_write(fd, data)

    log = node(tmp_path / "b")
    monkeypatch.setattr(audit.os, "write", killed_in_the_second_batch)
    with pytest.raises(SystemExit):
        audit.mirror(connect(readonly=True), log, batch=2)
    monkeypatch.setattr(audit.os, "write", real_write)
    log.close()
    (path,) = audit.log_files(tmp_path / "b")
    assert not path.read_bytes().endswith(b"\n")  # the torn tail the kill left
    with node(tmp_path / "b") as restarted:
        assert restarted.last_seq == 3  # the whole line of the torn batch stays, the rest is cut
        assert audit.mirror(connect(readonly=True), restarted, batch=2) == 2
    assert seqs(tmp_path / "b") == [1, 2, 3, 4, 5]
    assert_mirrors(leader, tmp_path / "b")


@PG
def test_mirror_append_failing_on_a_full_disk_is_cut_back_and_resumed(
    connect: Connect, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills a mirror that, when ENOSPC stops a batch part-way in a running process, leaves
    half a line for the next batch to glue onto, or writes the earlier batches again."""
    leader = connect()
    record(leader, *(f"f{n:011d}" for n in range(5)))
    real_write = os.write
    calls = 0

    def full_in_the_second_batch(fd: int, data: bytes) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            real_write(fd, data[: len(data) * 3 // 4])  # mid-line
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    standby = connect(readonly=True)
    with node(tmp_path / "b") as log:
        monkeypatch.setattr(audit.os, "write", full_in_the_second_batch)
        with pytest.raises(AuditWriteError):
            audit.mirror(standby, log, batch=2)
        monkeypatch.setattr(audit.os, "write", real_write)
        assert log.last_seq == 2
        assert audit.mirror(standby, log, batch=2) == 3
    assert seqs(tmp_path / "b") == [1, 2, 3, 4, 5]
    assert_mirrors(leader, tmp_path / "b")


# -- failover --------------------------------------------------------------------------------------


@PG
def test_failover_leaves_every_row_in_each_nodes_files_exactly_once(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills the new leader's flush going by the mark the old leader wrote: leadership moves
    back and forth between two nodes (terms 1, 2, 3), each flushing into its own files while it
    leads, each crashing with rows it committed but never flushed; the flush after each takeover
    started above the other node's mark, so the rows between its own files and that mark were
    never in its files. Each node's files must hold every row exactly once, in seq order, each
    line with its row's term."""
    dirs = {"pi-a": tmp_path / "a", "pi-b": tmp_path / "b"}
    written: list[str] = []
    for turn, name in enumerate(["pi-a", "pi-b", "pi-a"]):
        conn = connect()  # a new process: a new connection and a new view of its files
        if turn:
            expire(conn)
        term = lead(conn, name)
        assert term == turn + 1
        with node(dirs[name]) as log:
            assert audit.recover(conn, log) >= 0  # start-up: catch up with the journal
            for batch in range(3):
                ids = [f"t{term}b{batch}n{n:07d}" for n in range(2)]
                record(conn, *ids)
                written += ids
                if batch < 2:
                    audit.flush(conn, log)
            # batch 2 was committed and never flushed: the node dies here
    for name, directory in dirs.items():
        with node(directory) as log:  # each restarts as a standby
            audit.mirror(connect(readonly=True), log)
        found = seqs(directory)
        assert found == sorted(set(found)) == [seq for seq, _ in journal(conn)], name
        assert sorted(r["event_id"] for r in lines(directory)) == sorted(written), name
        terms = {int(r["seq"]): r["term"] for r in lines(directory)}
        assert terms == dict(journal(conn)), name
    assert_mirrors(conn, *dirs.values())


@PG
def test_restart_after_failover_recovers_by_its_own_files_not_another_nodes_mark(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills recovery going by the mark: a node whose files stopped at seq 1 restarts after
    the other node flushed (and marked) up to seq 4; recovery appended nothing between."""
    first = connect()
    lead(first, "pi-a")
    record(first, "aaaaaaaaaaa1")
    with node(tmp_path / "a") as log:
        audit.flush(first, log)
    record(first, "bbbbbbbbbbb2", "ccccccccccc3", "ddddddddddd4")
    with node(tmp_path / "b") as log:
        audit.flush(first, log)
    assert audit.flushed_seq(first) == 4
    with node(tmp_path / "a") as log:
        assert audit.recover(connect(), log) == 3
    assert seqs(tmp_path / "a") == [1, 2, 3, 4]


@PG
def test_mark_is_forward_only_so_a_late_write_from_a_node_behind_cannot_move_it_back(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills a mark that goes back: a node whose files are behind read the mark, another node
    wrote a higher one, then the first wrote its lower one (the mark is forward only)."""
    conn = connect()
    record(conn, "aaaaaaaaaaa1", "bbbbbbbbbbb2")
    with node(tmp_path / "ahead") as log:
        audit.flush(conn, log)
    assert audit.flushed_seq(conn) == 2
    with db.write_txn(conn):
        audit.mark_forward(conn, audit.FLUSHED_KEY, 1)
    assert audit.flushed_seq(conn) == 2


# -- the check -------------------------------------------------------------------------------------


@PG
def test_the_mirror_check_finds_a_missing_a_doubled_a_changed_and_a_reordered_line(
    connect: Connect, tmp_path: Path
) -> None:
    """The check is only as good as what it catches: each way a node's files can differ from
    the journal is reported, with the seqs it concerns."""
    conn = connect()
    record(conn, *(f"c{n:011d}" for n in range(4)))
    with node(tmp_path / "good") as log:
        audit.flush(conn, log)
    assert audit_mirror.matches(conn, tmp_path / "good")
    (path,) = audit.log_files(tmp_path / "good")
    one, two, three, four = path.read_text().splitlines(keepends=True)
    cases = {
        "missing": ([one, two, four], (3,)),
        "twice": ([one, two, three, four, four], (4,)),
        "differing": ([one, two, three.replace('"kind"', '"term":9,"kind"'), four], (3,)),
        "extra": ([one, two, three, four, four.replace('"seq":4', '"seq":5')], (5,)),
    }
    for kind, (content, expected) in cases.items():
        directory = tmp_path / kind
        directory.mkdir()
        (directory / path.name).write_text("".join(content))
        found = audit_mirror.compare(conn, directory)
        assert found is not None and getattr(found, kind) == expected, (kind, found)
        assert kind in str(found)
    reordered = tmp_path / "reordered"
    reordered.mkdir()
    (reordered / path.name).write_text("".join([one, three, two, four]))
    found = audit_mirror.compare(conn, reordered)
    assert found is not None and found.unordered == (path.name,)
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / path.name).write_text("".join([one, two, three, four[:20]]))
    found = audit_mirror.compare(conn, torn)
    assert found is not None and found.unreadable == (path.name,) and found.missing == (4,)


@PG
def test_new_leaders_cadence_folds_the_rows_its_files_lacked_below_the_other_nodes_mark(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills a takeover that forgets an open debounce window (a second triage request for the
    same incident): the new leader's files stop below the mark the old leader wrote, and the
    start-up fold read the files plus the journal above that mark, missing what lay between."""
    conn = connect()
    record(conn, "aaaaaaaaaaa1")
    with node(tmp_path / "a" / "audit") as log:
        audit.flush(conn, log)  # the old leader's files, and its mark
    config = harness.settings_for("http://127.0.0.1:9", tmp_path / "b")
    policy = cadence.Policy(debounce=60.0)
    state = recovery._rehydrate_cadence(conn, config, policy, lambda: NOW)
    assert "alerts:aaaaaaaaaaa1" in state.snapshot()["incidents"]


# -- rebuild ---------------------------------------------------------------------------------------


@PG
def test_a_lost_database_rebuilt_from_a_standbys_files_is_the_state_the_leaders_give(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills a standby whose files cannot stand in for the leader's: after the database is
    lost, rebuilding it (into a fresh schema) from the standby's mirror gives the same state as
    from the leader's files, and the state the database held; lines with a term are read."""
    leader = connect()
    term = lead(leader, "pi-a")
    queue = owner_queue(debounce=0.0, daily_cap=1)
    inbox.record_batch(
        leader,
        [make_message(f"r{n:011d}", title=f"incident {n % 2}") for n in range(5)],
        NOW,
        queue=queue,
        relay_enabled=True,
    )
    with db.write_txn(leader) as txn:
        queue.triage_message(txn, "agent:one", "reply one", NOW)
    with db.write_txn(leader) as txn:
        queue.triage_message(txn, "agent:two", "over the cap", NOW)
    with node(tmp_path / "a") as log:
        audit.flush(leader, log)
    with node(tmp_path / "b") as log:
        audit.mirror(connect(readonly=True), log)
    assert {r.get("term") for r in lines(tmp_path / "b")} == {term}
    original = _state(leader)
    states = []
    for directory in (tmp_path / "a", tmp_path / "b"):
        with harness.separate_store(tmp_path / "rebuilt") as target:
            fresh = db.connect(target)
            try:
                migrations.apply(fresh)
                assert rebuild.is_empty(fresh)
                summary = rebuild.from_audit(
                    fresh, directory, NOW, debounce=0.0, relay_enabled=True, feed_append=None
                )
                assert summary is not None and summary.seq == journal(leader)[-1][0]
                states.append(_state(fresh))
                record(fresh, "zzzzzzzzzzz9")  # new rows number above every line
                assert min(seq for seq, _ in journal(fresh)) > summary.seq
            finally:
                fresh.close()
    assert states[0] == states[1]
    for table in ("inbox", "incidents", "outbox_keys", "owner_outbox"):
        assert states[1][table] == original[table], table


def _state(conn: db.Connection) -> dict[str, Any]:
    def rows(sql: str) -> list[list[Any]]:
        return sorted(([*row] for row in conn.execute(sql)), key=json.dumps)

    return {
        "inbox": rows("SELECT event_id, topic, time, expires, incident_key, outcome FROM inbox"),
        "incidents": rows("SELECT key, severity, status, events FROM incidents"),
        "outbox_keys": rows("SELECT delivery_key, incident_key FROM outbox"),
        "outbox": rows("SELECT delivery_key, state, payload FROM outbox"),
        "owner_outbox": rows("SELECT key, kind, text, state FROM owner_outbox"),
        "cursor": rows("SELECT kind, value FROM cursor"),
        "kv": rows("SELECT name, value FROM kv WHERE name LIKE 'audit%'"),
    }


@PG
def test_node_behind_a_rebuild_is_told_what_its_files_lack_not_left_believing_it_is_whole(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills a standby that silently misses lines the rebuilt journal never held: its files
    stopped at seq 1 and the database was rebuilt from files that went to seq 3."""
    conn = connect()
    record(conn, "aaaaaaaaaaa1")
    with node(tmp_path / "b") as log:
        audit.mirror(conn, log)
    record(conn, "bbbbbbbbbbb2", "ccccccccccc3")
    with node(tmp_path / "a") as log:
        audit.flush(conn, log)
    harness.wipe_store(tmp_path)
    fresh = connect()
    migrations.apply(fresh)
    rebuild.from_audit(
        fresh, tmp_path / "a", NOW, debounce=0.0, relay_enabled=True, feed_append=None
    )
    with node(tmp_path / "b") as log:
        assert audit_mirror.unreachable(fresh, log) == (2, 3)
        audit.mirror(fresh, log)
        assert audit_mirror.unreachable(fresh, log) is None  # past it now: only the new rows
    with node(tmp_path / "a") as log:
        assert audit_mirror.unreachable(fresh, log) is None
        audit.mirror(fresh, log)
    assert_mirrors(fresh, tmp_path / "a", tmp_path / "b")


# -- retention -------------------------------------------------------------------------------------


@PG
def test_journal_is_pruned_past_its_window_never_above_the_mark(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills a journal that grows forever once flush no longer prunes it, and a prune that takes
    rows the leader's files do not hold yet (above the flushed mark), whatever their age."""
    conn = connect()
    record(conn, "old000000001", "old000000002", now=NOW - 8 * DAY)
    record(conn, "recent000001", now=NOW - 6 * DAY)
    with node(tmp_path / "a") as log:
        audit.flush(conn, log)
    record(conn, "unflushed001", now=NOW - 9 * DAY)  # an old clock, not yet in any file
    record(conn, "newest000001", now=NOW)
    pruned = retention.prune(conn, NOW, cache_duration=12 * 3600)
    assert pruned.journal == 2
    # The requests' releases at NOW follow: only seqs 1 and 2 went, the old unflushed 4 stays.
    assert [seq for seq, _ in journal(conn)][:3] == [3, 4, 5]
    assert audit_mirror.pruned_seq(conn) == 2
    with node(tmp_path / "late") as log:  # a node with no files: lines 1 and 2 are gone
        assert audit_mirror.unreachable(conn, log) == (1, 2)
    assert retention.prune(conn, NOW, cache_duration=12 * 3600).journal == 0


@PG
def test_pruning_node_whose_clock_jumped_ahead_keeps_the_rows_a_standby_needs(
    connect: Connect, tmp_path: Path
) -> None:
    """Kills a prune judged by a local clock that jumped 30 days ahead: every row would be past
    the window, and a standby a few seconds behind would never get them."""
    conn = connect()
    record(conn, "aaaaaaaaaaa1", "bbbbbbbbbbb2")
    with node(tmp_path / "a") as log:
        audit.flush(conn, log)
    assert retention.prune(conn, NOW + 30 * DAY, cache_duration=12 * 3600).journal == 0
    assert len(journal(conn)) == 2


def test_flush_prunes_the_journal_on_sqlite_and_keeps_it_on_postgresql(
    store: db.Connection, tmp_path: Path
) -> None:
    """The one-box path as it was (SQLite's flush prunes its staging journal to the mark); on
    PostgreSQL the flush keeps the rows for the other nodes."""
    record(store, "aaaaaaaaaaa1")
    with node(tmp_path / "a") as log:
        audit.flush(store, log)
    rows = store.execute("SELECT count(*) FROM audit_journal").fetchone()[0]
    assert rows == (1 if db.is_postgres(store) else 0)
    assert retention.prune(store, NOW, cache_duration=12 * 3600).journal == 0


# -- the standby's step (flow/journal.py) ----------------------------------------------------------


@PG
def test_standbys_journal_mirror_catches_up_in_trips_and_writes_nothing_to_the_database(
    connect: Connect, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kills a standby step that writes (a mark, a latch notice) to the database the leader
    owns, or holds the worker thread for the whole backlog: `Journal.mirror` appends in trips
    of MIRROR_LIMIT rows through a read-only connection, and a failing audit write is reported
    in `mirror_failure` (never latched) until an append works again."""
    leader = connect()
    record(leader, *(f"j{n:011d}" for n in range(7)))
    monkeypatch.setattr("ntfy_intake.flow.journal.MIRROR_LIMIT", 3)
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario(standby: Journal) -> None:
        trips: list[int] = []
        real = standby.mirror_sync

        def counted(limit: int = 3) -> int:
            trips.append(real(limit))
            return trips[-1]

        standby.mirror_sync = counted  # type: ignore[method-assign]
        assert await standby.mirror() == 7
        assert trips == [3, 3, 1]
        record(leader, "j00000000007")
        monkeypatch.setattr(audit.os, "write", full)
        assert await standby.mirror() == 0
        assert standby.mirror_failure is not None and "No space" in standby.mirror_failure
        assert not standby.latched
        monkeypatch.setattr(audit.os, "write", real_write)
        assert await standby.mirror() == 1
        assert standby.mirror_failure is None

    with _standby_journal(tmp_path / "b") as standby:
        asyncio.run(scenario(standby))
    assert seqs(tmp_path / "b") == list(range(1, 9))
    assert audit.flushed_seq(leader) == 0  # the standby moved no mark
    assert leader.execute("SELECT count(*) FROM owner_outbox").fetchone()[0] == 0


@contextlib.contextmanager
def _standby_journal(directory: Path) -> Iterator[Journal]:
    """A standby's Journal: its own audit files, the shared database through a read-only
    connection (any write would fail)."""

    class ReadOnly(Database):
        def open(self) -> db.Connection:
            self._conn = db.connect(self._path, readonly=True)
            return self._conn

    database = ReadOnly(
        db.Dsn(harness.DATABASE or ""),
        boot_id="standby",
        waits=StorageWaits(),
        degraded={},
        heartbeat=Heartbeat(),
    )
    database.open()
    policy = cadence.Policy()
    journal_ = Journal(
        database,
        audit.AuditLog(directory, lambda: NOW),
        owner_queue=CountedOwnerQueue(policy, cadence.CadenceState.empty(policy)),
        counters=Counters(),
        clock=lambda: NOW,
        boot_id="standby",
    )
    try:
        yield journal_
    finally:
        journal_.close()
        database.close()
