"""Two live processes under one node name, found only after one was fenced (issue 32, point 5):
the one that learns it from a fenced term exits 2 with one line, like a collision seen at start,
never 1 (systemd would restart it into the same fight). Real `ntfy-intake run` subprocesses on
one PostgreSQL store; the leader is paused with SIGSTOP past its lease, so the second process,
a copy of its box (the state directory's instance prefix copied with it), waits the lease out
and takes it, as it would from a box that hung."""

from __future__ import annotations

import shutil
import signal
import time

import pytest

from ntfy_intake.runtime.cluster import PREFIX_FILE

from ...harness import wait_until
from ...standby import Cluster, serving_as_leader

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]


def test_a_leader_fenced_by_a_clone_under_its_name_exits_2_not_1(cluster: Cluster) -> None:
    alpha = cluster.add("alpha", cluster_probe_every="1s").start()
    assert cluster.leader().name == "alpha"
    cluster.emu.wait_for_subscribers(1, timeout=30)
    wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
    first = cluster.lease()
    assert first is not None
    alpha.send(signal.SIGSTOP)  # hung: renews nothing, reports nothing
    clone = cluster.add("alpha", state="alpha-clone", cluster_probe_every="1s")
    clone.state_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(alpha.state_dir / PREFIX_FILE, clone.state_dir / PREFIX_FILE)
    clone.start()
    try:
        cluster.wait_lease(lambda s: s.term > first.term, 60, "the clone's term")
    finally:
        alpha.send(signal.SIGCONT)
    assert alpha.proc is not None
    deadline = time.monotonic() + 60
    while alpha.alive and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"\nalpha: exit {alpha.proc.poll()}, stderr {alpha.stderr().strip()[-300:]!r}")
    assert alpha.proc.poll() == 2, alpha.stderr()[-2000:]
    last = alpha.stderr().strip().splitlines()[-1]
    assert "node name 'alpha' is in use" in last and "Traceback" not in alpha.stderr()
