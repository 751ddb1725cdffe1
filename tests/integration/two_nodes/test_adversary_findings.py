"""Defects found by trying to break issue 32's work as an operator running two Pis would (the
adversary's pass, 2026-12-06), on real `ntfy-intake run` subprocesses sharing one PostgreSQL
store. Each test is the finding's reproduction, marked xfail(strict): it fails on today's code,
and the fix flips it (strict: then the mark must go)."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from ntfy_intake.runtime.cluster import PREFIX_FILE

from ...harness import wait_until
from ...standby import Cluster, serving_as_leader, standing_by
from ...standby_nodes import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]

PROBE = {"cluster_probe_every": "1s", "cluster_yield_after": "4s"}


def holder(cluster: Cluster) -> tuple[str, str, int] | None:
    found = cluster.try_rows("SELECT node, instance, term FROM leadership WHERE id = 1")
    return (str(found[0][0]), str(found[0][1]), int(found[0][2])) if found else None


@pytest.mark.xfail(
    strict=True,
    reason="finding: a second box cloned from the first's SD card (same node name, the state"
    " directory's instance prefix copied with it) is taken for the live leader's crashed"
    " predecessor: it takes the live leader's lease at once instead of exiting 2",
)
def test_a_cloned_box_under_the_leader_s_name_exits_2_and_never_takes_its_lease(
    cluster: Cluster,
) -> None:
    """An operator sets up Pi 1, runs it, then clones its SD card for Pi 2 (the usual way to
    make a second Pi) and starts it without changing `[cluster] node` (defaulting to the host
    name, `raspberrypi` on both). The state directory's `cluster-instance-prefix` came with the
    clone, so store/leadership._takeable and store/nodes.report read the live leader's lease
    and row as this node's own crashed predecessor's ("reclaimed at once"): the same name in
    use is never seen, and the clone takes the work from a live, healthy leader. Seen: the clone
    took term 2 within 3 s; alpha was fenced, stepped down, took term 3 back (the clone, too,
    looks like its crashed predecessor), and the clone exited 1 ("term 2 is over (the leadership
    row holds term 3): this write is rolled back"): exit 1, so systemd restarts it and the
    cycle repeats at every restart. A second live process under an existing name must exit 2
    (issue 32, point 5), prefix or not."""
    alpha = cluster.add("alpha", **PROBE).start()
    assert cluster.leader().name == "alpha"
    cluster.emu.wait_for_subscribers(1, timeout=30)
    wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
    before = holder(cluster)
    assert before is not None and before[0] == "alpha"
    clone = cluster.add("alpha", state="alpha-clone", **PROBE)
    clone.state_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(alpha.state_dir / PREFIX_FILE, clone.state_dir / PREFIX_FILE)  # the clone's
    clone.start()
    deadline = time.monotonic() + 30
    moved: tuple[str, str, int] | None = None
    while time.monotonic() < deadline and clone.alive:
        now = holder(cluster)
        if now is not None and now[1] != before[1]:
            moved = now
            break
        time.sleep(0.2)
    print(f"\nlease before {before}, moved to {moved}; clone alive: {clone.alive}")
    print(f"clone's stderr: {clone.stderr().strip()[:300]}")
    assert moved is None, f"the clone took a live leader's lease: {before} -> {moved}"
    assert not clone.alive and clone.proc is not None and clone.proc.returncode == 2
    assert "in use" in clone.stderr()
    assert alpha.alive


@pytest.mark.xfail(
    strict=True,
    reason="finding: readiness probes only ntfy: a standby that cannot reach relay.url (the"
    " triage agent on the leader's loopback, the same URL text on both boxes) says ready",
)
def test_a_standby_that_cannot_reach_the_relay_is_not_ready(cluster: Cluster) -> None:
    """`relay.url = "http://127.0.0.1:9000/triage"` in the one config both boxes share (docs/
    standby.md: "the same configuration on both boxes"), with the agent running on box 1 only:
    the fingerprint is the same text, so the same work, and box 2's probe asks ntfy alone.
    Box 2 says ready (healthz 200 `standby`, `check` 0, ntfy_intake_ready 1), box 1 yields to it
    or stops, and from then on every alert is recorded but no agent hears of it: the issue's
    "a standby pointed at a dead URL reports healthy until it has to lead", for the relay.
    (The hook gives both nodes one relay in the fingerprint, as the shared text would; only
    beta's route to it is dead.)"""
    alpha = cluster.add("alpha", **PROBE).start()
    assert cluster.leader().name == "alpha"
    cluster.emu.wait_for_subscribers(1, timeout=30)
    wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
    beta = cluster.add("beta", **PROBE)
    beta.env["NTFY_INTAKE_RELAY_URL"] = f"http://127.0.0.1:{free_port()}/triage"  # nothing there
    beta.start()
    wait_until(lambda: beta.healthz() is not None, 30, "beta answering")
    time.sleep(6.0)  # six probes at probe_every = 1 s
    answer = beta.healthz()
    check = beta.command("check")
    print(f"\nbeta /healthz: {answer}; check: {check.returncode} {check.stdout.strip()[:200]}")
    assert answer is not None and answer[0] == 503 and answer[1].get("ready") is False, answer
    assert check.returncode == 1, check.stdout


@pytest.mark.xfail(
    strict=True,
    reason="finding: a burst of wrong tokens against the STANDBY's surface (same http.token as"
    " the leader's) is held and logged there, but the owner is never told: no login_notice on a"
    " standby",
)
def test_a_brute_force_against_the_standby_tells_the_owner_once(cluster: Cluster) -> None:
    """Both boxes serve the console and the bearer endpoints with ONE `http.token` (docs/
    standby.md: the same configuration on both). The leader's guard records one owner notice
    per episode; the standby's has no notice sink (runtime/standby.py: "a standby cannot
    write"), so a guesser who picks the standby's address is held, and the owner, who is the
    one person who could rotate the token, hears nothing. The token it finds opens the leader."""
    alpha = cluster.add("alpha", **PROBE).start()
    assert cluster.leader().name == "alpha"
    cluster.emu.wait_for_subscribers(1, timeout=30)
    wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
    beta = cluster.add("beta", **PROBE).start()
    wait_until(lambda: standing_by(beta), 30, "beta standing by")
    codes = []
    with httpx.Client(base_url=f"http://127.0.0.1:{beta.port}", timeout=10) as client:
        for i in range(8):
            wrong = {"Authorization": f"Bearer wrong-{i:02d}-Hq2Xv9Lp4Zt"}
            codes.append(client.get("/v1/feed/agent", headers=wrong).status_code)
    print(f"\nagainst the standby: {codes}")
    assert codes == [403] * 5 + [429] * 3, codes  # the standby's own guard holds it

    def notices() -> list[tuple[object, ...]]:
        found = cluster.try_rows(
            "SELECT key FROM owner_outbox WHERE kind = 'notice' AND key LIKE 'login_throttled:%'"
        )
        return found or []

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not notices():
        time.sleep(0.5)
    print(f"owner notices: {notices()}")
    assert len(notices()) == 1, "the owner was not told of the burst against the standby"
