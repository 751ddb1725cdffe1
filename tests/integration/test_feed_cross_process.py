"""The feed's invariants across real processes sharing one store (a SQLite file, or one
PostgreSQL schema, which each child opens by the test's full DSN).

Every child is a fresh interpreter; each prints "ready", blocks on stdin until the test says go (so
the processes really overlap), and is killed by pid in teardown whatever happened.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ntfy_intake.store import db, migrations
from ntfy_intake.store.feed import FeedStore

from .. import harness
from ..harness import Child

pytestmark = [pytest.mark.slow, pytest.mark.engines]

WAIT = 60.0


@pytest.fixture
def db_path(tmp_path: Path) -> db.Target:
    return harness.store_of(tmp_path / "state")


@pytest.fixture
def store(db_path: db.Target) -> Iterator[FeedStore]:
    opened = FeedStore.open(db_path)
    yield opened
    opened.close()


def start_together(children: list[Child]) -> None:
    for child in children:
        assert child.expect_line() == "ready"
    for child in children:
        child.send("go")


ACKER = """
import json, random, sys
from ntfy_intake.store.feed import FeedStore

store = FeedStore.open(sys.argv[1])
order = list(range(1, int(sys.argv[3]) + 1))
random.Random(int(sys.argv[2])).shuffle(order)
print("ready", flush=True)
sys.stdin.readline()
results = [[seq, store.ack("triager", "triage", seq)] for seq in order]
store.close()
print(json.dumps(results), flush=True)
"""

ONE_ACK = """
import json, sys
from ntfy_intake.store.feed import FeedStore

store = FeedStore.open(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps(store.ack("triager", "triage", int(sys.argv[2]))), flush=True)
store.close()
"""


def test_stale_ack_from_another_process_never_regresses_the_cursor(
    store: FeedStore, spawn: Callable[..., Child]
) -> None:
    """Failure mode: a late ack from another process moves the shared cursor backwards."""
    total = 200
    store.subscribe("triager", at="start")
    for i in range(total):
        store.post("triage", {"i": i}, sender="ntfy-intake", summary=f"alert {i}")
    assert store.ack("triager", "triage", 150) == 150

    late = spawn(ONE_ACK, harness.target_arg(store.db_path), 100)
    start_together([late])
    assert json.loads(late.expect_line()) == 150
    assert store.cursor("triager", "triage") == 150

    # Two processes ack every seq in shuffled orders at the same time: each sees a cursor that
    # never goes down and never lags its own ack, and the end state is the head.
    ackers = [spawn(ACKER, harness.target_arg(store.db_path), seed, total) for seed in (1, 2)]
    start_together(ackers)
    for acker in ackers:
        results = json.loads(acker.expect_line())
        cursors = [cursor for _, cursor in results]
        assert cursors == sorted(cursors)
        assert all(cursor >= max(seq, 150) for seq, cursor in results)
    assert store.cursor("triager", "triage") == total


POSTER = """
import json, sys
from ntfy_intake.store.feed import FeedStore

store = FeedStore.open(sys.argv[1])
name, count = sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
out = []
for i in range(count):
    key = f"shared-{i // 2}" if i % 2 == 0 else f"{name}-{i // 2}"
    entry = store.post(
        "triage", {"i": i, "by": name}, sender=name, summary=f"post {i}", idempotency_key=key
    )
    out.append([key, entry.seq])
store.close()
print(json.dumps(out), flush=True)
"""


def test_concurrent_posters_never_collide_on_seq_and_dedup_holds(
    tmp_path: Path, store: FeedStore, spawn: Callable[..., Child]
) -> None:
    """Failure mode: two processes post at once and collide on seq or double-post a retried key."""
    count = 200  # per process: half keys shared with the other poster, half its own
    posters = [
        spawn(POSTER, harness.target_arg(store.db_path), name, count) for name in ("left", "right")
    ]
    start_together(posters)
    reports = [dict(json.loads(poster.expect_line())) for poster in posters]

    expected = count // 2 + 2 * (count // 2)
    assert store.head("triage") == expected
    stored = harness.query(tmp_path / "state", "SELECT idempotency_key, seq FROM feed_entries")
    assert sorted(seq for _, seq in stored) == list(range(1, expected + 1))
    by_key = dict(stored)
    assert len(by_key) == expected
    for report in reports:
        assert all(by_key[key] == seq for key, seq in report.items())
    shared = {key for key in reports[0] if key.startswith("shared-")}
    assert len(shared) == count // 2
    assert all(reports[0][key] == reports[1][key] for key in shared)


OPENER = """
import sys
from ntfy_intake.store.feed import FeedStore

print("ready", flush=True)
sys.stdin.readline()
FeedStore.open(sys.argv[1]).close()
print("opened", flush=True)
"""


def test_concurrent_first_open_migrates_once(
    tmp_path: Path, db_path: db.Target, spawn: Callable[..., Child]
) -> None:
    """Failure mode: agents starting together on a fresh state dir crash racing the migration."""
    openers = [spawn(OPENER, harness.target_arg(db_path)) for _ in range(4)]
    start_together(openers)
    for opener in openers:
        assert opener.expect_line() == "opened"
    names = harness.query(tmp_path / "state", "SELECT name FROM schema_migrations ORDER BY name")
    # Each step of the one list recorded once (the feed opens the whole schema since issue 22).
    assert names == [(name,) for name, _ in migrations.SQLITE]


RINGER = """
import json, sys, time
from ntfy_intake.store.doorbell import Doorbell
from ntfy_intake.store.feed import FeedStore

store = FeedStore.open(sys.argv[1])
store.subscribe("triager")
bell = Doorbell(store, "triager")
print("ready", flush=True)
sys.stdin.readline()
for _ in range(int(sys.argv[2])):
    event = bell.wait(30)
    rang_at = time.monotonic()
    if event is None:
        print("null", flush=True)
        break
    store.ack("triager", event.channel, event.seq)
    print(json.dumps({"seq": event.seq, "at": rang_at}), flush=True)
"""


def test_doorbell_rings_for_a_post_from_another_process(
    store: FeedStore, spawn: Callable[..., Child]
) -> None:
    """Failure mode: a waiter only hears posts made in its own process."""
    rounds = 15
    waiter = spawn(RINGER, harness.target_arg(store.db_path), rounds)
    start_together([waiter])
    latencies = []
    for _ in range(rounds):
        posted_at = time.monotonic()  # CLOCK_MONOTONIC is system-wide on Linux
        entry = store.post("triage", {}, sender="ntfy-intake", summary="cross-process")
        ring = json.loads(waiter.expect_line())
        assert ring["seq"] == entry.seq
        latencies.append(ring["at"] - posted_at)
    assert max(latencies) < 2.0, latencies
    # Informational bound far above the 10 ms poll interval, so a loaded CI box does not flake.
    assert statistics.median(latencies) < 0.25, latencies
