"""A node whose audit log latched is not ready (runtime/readiness.Prober, rules/readiness.
latch_reason; DESIGN.md section 11: readiness is "that it could do the work"), two probers in
process against the ntfy emulator on a real socket and a real PostgreSQL. Named after the
failure it kills (the two-node run of it: tests/integration/two_nodes/test_latch_ready.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ntfy_intake.rules.readiness import LATCHED, WorkState
from ntfy_intake.runtime.readiness import Prober
from ntfy_intake.store import db, leadership
from ntfy_intake.testbed.emulator import NtfyEmulator

from .. import harness
from .test_readiness_probe import GOOD, emu, prober_for, stored

pytestmark = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
__all__ = ["emu"]  # the fixture, shared


def _claim(node: Prober) -> None:
    conn = db.connect(db.Dsn(harness.DATABASE or ""))
    try:
        assert leadership.claim(conn, node.member.node, node.member.instance, 8.0).won
    finally:
        conn.close()


def test_a_node_whose_term_ended_latched_says_not_ready_and_leads_only_when_nobody_is(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    """The standby drill's audit_full round: the latched leader yielded, and its row said ready
    again once the other node held the lease, so it stayed a ready peer (to yield back to, to
    hold off for in a cool-off) and took the lease back itself. Now its row says why it could
    not do the work until its process restarts; with no other node ready it still leads."""
    pi = prober_for(tmp_path, emu.url, "pi", ntfy_token=GOOD)
    nas = prober_for(tmp_path, emu.url, "nas", ntfy_token=GOOD)
    try:
        for prober in (pi, nas):
            # Rows fresh for 25 s, not 2.5: a busy box must not age a row out between two
            # steps here (the staleness rule has tests of its own).
            prober.probe_every = 10.0
            asyncio.run(prober.probe(first=True))
        assert stored(pi).ready and stored(nas).ready
        # pi leads and its audit log latches: its own row says so at its next probe.
        pi.work_state = lambda: WorkState("latched", time.monotonic())
        asyncio.run(pi.probe())
        row = stored(pi)
        assert not row.ready and row.reason == LATCHED and row.intake == "latched", row
        # It yields (the term's daemon ended latched) and nas takes the lease.
        pi.stand_by(latched=True)
        asyncio.run(pi.leaving("yielded the work to nas"))
        _claim(nas)
        asyncio.run(pi.probe())
        row = stored(pi)
        assert not row.ready and row.reason == LATCHED and row.intake == "standby", row
        asyncio.run(nas.probe())
        assert nas.peers_ready() == []  # nas would not yield back to it, nor hold off for it
        # One model: status, health and metrics read this node's reason from the row.
        view = pi.view()
        assert view["ready"] is False and view["not_ready"] == LATCHED, view
        assert f"not ready: {LATCHED}" in view["cluster_problems"], view
        # Soft: held off while another node is ready, never when none is.
        assert pi.hold_off() == LATCHED
        asyncio.run(nas.leaving("stopped (a graceful stop)"))
        assert pi.hold_off() is None
        # A new term runs a new daemon: its own audit log decides from then on.
        pi.lead(object())
        pi.work_state = lambda: WorkState("live", time.monotonic())
        asyncio.run(pi.probe())
        assert stored(pi).ready
    finally:
        for prober in (pi, nas):
            prober.close()
            prober.member.close()
