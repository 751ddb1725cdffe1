"""The fallback topic's buttons in a standby pair (DESIGN.md sections 9 and 13): two real
`ntfy-intake run` nodes on one PostgreSQL store, each with its own `http.public_url`. A button
pressed at the standby acts on nothing (503 naming the leader); once the standby leads, the
token the old leader signed works there, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.testbed.receiver import ReceiverHandle

from ... import harness
from ...harness import wait_until
from ...standby import Cluster, serving_as_leader, standing_by

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("engine", ["postgresql"], indirect=True),
]

FALLBACK = "owner-notices"


def ack_button(emu: NtfyEmulator) -> dict[str, Any]:
    def found() -> list[dict[str, Any]]:
        response = httpx.get(f"{emu.url}/{FALLBACK}/json?poll=1", timeout=10)
        events = [httpx.Response(200, content=line).json() for line in response.text.splitlines()]
        return [a for e in events for a in e.get("actions", []) if a["label"] == "Ack"]

    wait_until(found, timeout=60, what="the fallback message's Ack button")
    return found()[0]


def test_a_button_signed_by_the_old_leader_works_on_the_new_one_and_not_on_a_standby(
    tmp_path: Path, emu: NtfyEmulator, triage: ReceiverHandle
) -> None:
    """Failure modes: a standby acts on a press it cannot write (or answers as if it did), and
    after a failover every button on the owner's phone is refused (each node its own key)."""
    assert harness.DATABASE is not None
    cluster = Cluster(
        tmp_path,
        harness.DATABASE,
        emu,
        relay_url=triage.url,
        owner_fallback_topic=FALLBACK,
    )
    try:
        alpha, beta = cluster.add("alpha"), cluster.add("beta")
        for node in (alpha, beta):
            node.env["NTFY_INTAKE_HTTP_PUBLIC_URL"] = f"http://127.0.0.1:{node.port}"
        alpha.start()
        assert cluster.leader().name == "alpha"
        emu.wait_for_subscribers(1, timeout=30)
        wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
        beta.start()
        wait_until(lambda: standing_by(beta), 30, "beta standing by")

        emu.publish("alerts", "Disk full number 1", title="Disk full", priority=5)
        ack = ack_button(emu)
        assert ack["url"] == f"http://127.0.0.1:{alpha.port}/v1/owner/buttons/ack"
        at_beta = f"http://127.0.0.1:{beta.port}/v1/owner/buttons/ack"

        refused = httpx.post(at_beta, content=ack["body"].encode(), timeout=10)
        assert refused.status_code == 503
        assert refused.json()["error"] == "standby"
        assert cluster.rows("SELECT count(*) FROM owner_acks") == [(0,)]

        alpha.kill9()
        wait_until(lambda: serving_as_leader(beta), 60, "beta serving as the leader")
        done = httpx.post(at_beta, content=ack["body"].encode(), timeout=10)
        assert done.status_code == 200, done.text
        assert done.json()["result"] == "acknowledged"
        again = httpx.post(at_beta, content=ack["body"].encode(), timeout=10)
        assert again.status_code == 409
        assert cluster.rows("SELECT count(*) FROM owner_acks") == [(1,)]
    finally:
        cluster.close()
