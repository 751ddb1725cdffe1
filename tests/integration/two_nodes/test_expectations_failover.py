"""`[[expect]]` across a failover (DESIGN.md section 12): the leader tells the owner that a
publisher went quiet, is killed (-9), and the standby that takes over folds the same audit
records: it does not tell it again, and tells the `back` once when the publisher reports.
Two real `ntfy-intake run` nodes on one PostgreSQL store and the emulator; every = 3s."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest

from ...harness import wait_until
from ...standby import Cluster, leader_and_standby, serving_as_leader

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]

EXPECT = """
[[expect]]
name = "nightly-backup"
topic = "backups"
title = "backup finished"
every = "3s"
grace = "1s"
"""
LOOK = 7.0  # the new leader's start, its replay caught up, then a whole window


def told(cluster: Cluster, notice: str) -> list[dict[str, object]]:
    """The journal's `notice` lines of one kind: what every node's audit files hold."""
    lines = [json.loads(line) for (line,) in cluster.rows("SELECT line FROM audit_journal")]
    return [r for r in lines if r.get("kind") == "notice" and r.get("notice") == notice]


def instant(at: object) -> str:
    """A window start as the notices write it: whole UTC seconds."""
    assert isinstance(at, int)
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_failover_tells_a_quiet_publisher_once_and_its_return_once(cluster: Cluster) -> None:
    config = cluster.tmp_path / "expect.toml"
    config.write_text(EXPECT)
    cluster.settings["config"] = str(config)
    alpha, beta = leader_and_standby(cluster)
    published = cluster.emu.publish("backups", "3 GB in 2m", title="Backup finished")
    # The episode the publication opens (its window starts at ntfy's `time`). Under load,
    # alpha's start + every + grace can pass before the publish (beta's start alone may take
    # that long): "nothing since the daemon started" is then an episode of its own, told missed
    # and back by the publication, and not the one this test hands over.
    start = instant(published["time"])
    episode = f"expect:nightly-backup:{start}"
    wait_until(
        lambda: episode in [r["key"] for r in told(cluster, "expect_missed")],
        30,
        "the missed notice of the publication's episode, told by alpha",
    )
    alpha.kill9()
    cluster.wait_lease(lambda lease: lease.node == "beta", 30, "beta leading")
    wait_until(lambda: serving_as_leader(beta), 30, "beta serving as the leader")
    time.sleep(LOOK)
    missed = [r["key"] for r in told(cluster, "expect_missed")]
    assert missed.count(episode) == 1, missed
    before = [r for r in told(cluster, "expect_missed") if r["key"] != episode]
    assert len(before) <= 1 and all(r["window_start"] < start for r in before), before
    again = cluster.emu.publish("backups", "3 GB in 3m", title="Backup finished")
    wait_until(
        lambda: f"{episode}:back" in [r["key"] for r in told(cluster, "expect_back")],
        30,
        "the back notice",
    )
    backs = [r["key"] for r in told(cluster, "expect_back")]
    assert sorted(backs) == sorted([f"{r['key']}:back" for r in before] + [f"{episode}:back"])
    # The episode the second publication opens may fall due while this reads (under load).
    later = f"expect:nightly-backup:{instant(again['time'])}"
    keys = cluster.rows("SELECT key FROM owner_outbox WHERE key LIKE 'expect:%' ORDER BY key")
    assert [k for (k,) in keys if k != later] == sorted(missed + backs)
