"""A node that gives the work up (a graceful stop, a yield) is no ready peer for anyone
(runtime/readiness.Prober `leaving`, `campaign_peers`; DESIGN.md section 11), two probers in
process against the ntfy emulator on a real socket and a real PostgreSQL. Each test is named
after the failure it kills (the two-node figures: tests/integration/two_nodes/
test_handover_bounds.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ntfy_intake.rules.lease import Seen
from ntfy_intake.runtime.readiness import Prober
from ntfy_intake.store import db, leadership
from ntfy_intake.testbed.emulator import NtfyEmulator

from .. import harness
from .test_readiness_probe import GOOD, emu, prober_for, stored

pytestmark = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
__all__ = ["emu"]  # the fixture, shared


def _pair(tmp_path: Path, emu: NtfyEmulator) -> tuple[Prober, Prober]:
    pi = prober_for(tmp_path, emu.url, "pi", ntfy_token=GOOD)
    nas = prober_for(tmp_path, emu.url, "nas", ntfy_token=GOOD)
    for prober in (pi, nas):
        asyncio.run(prober.probe(first=True))
    assert stored(pi).ready and stored(nas).ready
    return pi, nas


def _close(*probers: Prober) -> None:
    for prober in probers:
        prober.close()
        prober.member.close()


def test_a_node_that_stopped_is_no_ready_peer_once_the_lease_is_free(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    """The defaults run: a graceful stop within the other node's cool-off waited 10 s, the
    stopped node's row still "ready" in the other's last read for up to two probes."""
    pi, nas = _pair(tmp_path, emu)
    try:
        assert [p.node for p in nas.peers_ready()] == ["pi"]
        asyncio.run(pi.leaving("stopped (a graceful stop)"))
        row = stored(pi)
        assert not row.ready and row.reason == "stopped (a graceful stop)"
        assert pi.hold_off() is None  # its own campaign is its own probe's to hold off
        # The lease still held (by pi, fresh): the last read stands, no statement.
        nas.member.row = Seen("pi", pi.member.instance, 1, 0.0, 5.0)
        nas.member.row_read_at = time.monotonic()
        assert [p.node for p in nas.campaign_peers()] == ["pi"]
        # Released: read again, and pi counts no more.
        nas.member.row = Seen("pi", pi.member.instance, 1, 0.0, -0.01)
        nas.member.row_read_at = time.monotonic()
        assert nas.campaign_peers() == []
    finally:
        _close(pi, nas)


def test_a_yielders_row_says_it_yielded_until_another_node_holds_the_lease(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    """The defaults run's two faults within one cool-off: a latched leader that yielded back
    still reported ready, so the node in its cool-off did not campaign and the yielder took
    its own lease back. Its row says it yielded until a probe sees the other node leading."""
    pi, nas = _pair(tmp_path, emu)
    try:
        asyncio.run(pi.leaving("yielded the work to nas"))
        asyncio.run(pi.probe())  # the lease free (nobody holds it): still yielded
        row = stored(pi)
        assert not row.ready and row.reason == "yielded the work to nas", row
        assert nas.campaign_peers() == []
        conn = db.connect(db.Dsn(harness.DATABASE or ""))
        try:
            taken = leadership.claim(conn, "nas", nas.member.instance, 8.0)
        finally:
            conn.close()
        assert taken.won
        asyncio.run(pi.probe())
        row = stored(pi)
        assert row.ready and row.reason is None, row
    finally:
        _close(pi, nas)
