"""`[[expect]]` across a failover (DESIGN.md section 12): the leader tells the owner that a
publisher went quiet, is killed (-9), and the standby that takes over folds the same audit
records: it does not tell it again, and tells the `back` once when the publisher reports.
Two real `ntfy-intake run` nodes on one PostgreSQL store and the emulator; every = 3s."""

from __future__ import annotations

import json
import time

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


def test_a_failover_tells_a_quiet_publisher_once_and_its_return_once(cluster: Cluster) -> None:
    config = cluster.tmp_path / "expect.toml"
    config.write_text(EXPECT)
    cluster.settings["config"] = str(config)
    alpha, beta = leader_and_standby(cluster)
    cluster.emu.publish("backups", "3 GB in 2m", title="Backup finished")
    wait_until(lambda: len(told(cluster, "expect_missed")) == 1, 30, "the missed notice")
    alpha.kill9()
    cluster.wait_lease(lambda lease: lease.node == "beta", 30, "beta leading")
    wait_until(lambda: serving_as_leader(beta), 30, "beta serving as the leader")
    time.sleep(LOOK)
    (missed,) = told(cluster, "expect_missed")
    cluster.emu.publish("backups", "3 GB in 3m", title="Backup finished")
    wait_until(lambda: len(told(cluster, "expect_back")) == 1, 30, "the back notice")
    (back,) = told(cluster, "expect_back")
    assert back["key"] == f"{missed['key']}:back"
    keys = cluster.rows("SELECT key FROM owner_outbox WHERE key LIKE 'expect:%' ORDER BY key")
    assert keys == [(missed["key"],), (back["key"],)]
