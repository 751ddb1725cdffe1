"""One node's readiness probe in process (runtime/readiness.Prober; DESIGN.md section 11), against
the ntfy emulator on a real socket and a real PostgreSQL: what it stores and says when its ntfy
refuses it or does not answer (the status or the error, never a credential), and when it holds
the node off the lease. Each test is named after the failure it kills."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake.errors import StartupError
from ntfy_intake.rules import readiness as rules
from ntfy_intake.rules.readiness import WorkState
from ntfy_intake.runtime.cluster import Member
from ntfy_intake.runtime.readiness import WORK_NTFY_URL_ENV, Prober
from ntfy_intake.settings import Settings
from ntfy_intake.store import db, migrations, nodes
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from .. import harness
from ..standby_nodes import free_port

pytestmark = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)

GOOD = "tk_" + "g" * 29
WRONG = "tk_" + "w" * 29
PASSWORD = "S3cr3t-pa55"


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    config = EmulatorConfig(tokens={GOOD: ["alerts", "backups"]}, auth_failure_limit=False)
    with NtfyEmulator(config).running() as emulator:
        yield emulator


def prober_for(tmp_path: Path, url: str, node: str = "pi", **overrides: str) -> Prober:
    assert harness.DATABASE is not None
    state = tmp_path / node
    state.mkdir(exist_ok=True)
    config: Settings = harness.settings_for(
        url, state, cluster_node=node, cluster_probe_every="1s", **overrides
    )
    assert isinstance(config.state.store, db.Dsn)
    # A state directory of its own: its own instance prefix (cluster.directory_prefix).
    member = Member(
        config.state.store,
        node=node,
        lease_ttl=8.0,
        renew_every=2.0,
        prefix=f"{uuid.uuid4().hex[:8]}.",
    )
    member.prepare()
    return Prober(config, member)


def probe(prober: Prober, *, first: bool = False) -> None:
    asyncio.run(prober.probe(first=first))


def stored(prober: Prober) -> rules.NodeSeen:
    conn = db.connect(db.Dsn(harness.DATABASE or ""))
    try:
        (row,) = (r for r in nodes.read_all(conn) if r.node == prober.member.node)
    finally:
        conn.close()
    return row


def test_a_refused_token_is_named_by_its_status_and_never_shown(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    host = emu.url.split("//")[1]
    prober = prober_for(tmp_path, f"http://intake:{PASSWORD}@{host}", ntfy_token=WRONG)
    try:
        probe(prober, first=True)
        reason = prober.not_ready_reason()
        row = stored(prober)
    finally:
        prober.close()
        prober.member.close()
    print(f"\n{reason}")
    assert reason is not None and reason.startswith("ntfy answered HTTP 40"), reason
    assert not row.ready and row.reason == reason
    for secret in (WRONG, PASSWORD, "intake:"):
        assert secret not in reason


def test_an_address_that_does_not_answer_is_named_without_its_credentials(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    dead = f"http://intake:{PASSWORD}@127.0.0.1:{free_port()}/base"  # ntfy.url takes no query
    prober = prober_for(tmp_path, dead, ntfy_token=GOOD)
    try:
        probe(prober, first=True)
        reason = prober.not_ready_reason() or ""
    finally:
        prober.close()
        prober.member.close()
    print(f"\n{reason}")
    assert reason.startswith("ntfy unreachable from this node (http://127.0.0.1:")
    assert "/base" in reason
    for secret in (GOOD, PASSWORD, "intake:"):
        assert secret not in reason


def test_the_right_credentials_make_the_node_ready(tmp_path: Path, emu: NtfyEmulator) -> None:
    prober = prober_for(tmp_path, emu.url, ntfy_token=GOOD)
    try:
        probe(prober, first=True)
        assert prober.not_ready_reason() is None
        row = stored(prober)
        assert row.ready and row.schema_known and row.intake == "standby"
        assert row.fingerprint == prober.fingerprint and dict(row.parts) == prober.parts
        assert prober.hold_off() is None
    finally:
        prober.close()
        prober.member.close()


def test_ntfy_unreachable_holds_the_node_off_only_while_another_node_is_ready(
    tmp_path: Path, emu: NtfyEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader that cannot reach ntfy beats no leader; a ready node beats both."""
    cut = prober_for(tmp_path, f"http://127.0.0.1:{free_port()}", node="pi")
    ready = prober_for(tmp_path, emu.url, node="nas", ntfy_token=GOOD)
    try:
        probe(cut, first=True)
        assert cut.not_ready_reason() is not None
        assert cut.hold_off() is None, "nobody better: it may lead"
        probe(ready, first=True)
        assert ready.fingerprint != cut.fingerprint  # the URLs differ: not a peer of pi's
        probe(cut)
        assert cut.hold_off() is None
    finally:
        for p in (cut, ready):
            p.close()
            p.member.close()
    same = prober_for(tmp_path, emu.url, node="nas2", ntfy_token=GOOD)
    # pi2's own route to the one ntfy is dead (the tests' hook names the work's ntfy).
    monkeypatch.setenv(WORK_NTFY_URL_ENV, emu.url)
    dead = prober_for(tmp_path, f"http://127.0.0.1:{free_port()}", node="pi2")
    try:
        probe(same, first=True)
        probe(dead, first=True)
        assert "nas2" in [p.node for p in dead.peers_ready()]
        reason = dead.hold_off()
        assert reason is not None and "ntfy unreachable" in reason
    finally:
        for p in (same, dead):
            p.close()
            p.member.close()


def test_a_ledger_step_this_code_does_not_know_holds_the_node_off_for_good(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    prober = prober_for(tmp_path, emu.url, ntfy_token=GOOD)
    conn = db.connect(db.Dsn(harness.DATABASE or ""))
    try:
        migrations.apply(conn)
        conn.execute("INSERT INTO schema_migrations(name) VALUES ('0099_newer')")
        probe(prober)
        reason = prober.hold_off()
        assert reason is not None and "0099_newer" in reason, reason
        assert not stored(prober).schema_known
    finally:
        conn.close()
        prober.close()
        prober.member.close()


def test_a_second_instance_under_a_reporting_node_s_name_is_a_startup_error(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    first = prober_for(tmp_path, emu.url, node="pi", ntfy_token=GOOD)
    (tmp_path / "twin").mkdir()
    twin = prober_for(tmp_path / "twin", emu.url, node="pi", ntfy_token=GOOD)
    try:
        probe(first, first=True)
        probe(twin, first=True)
        reason = twin.hold_off()
        assert reason is not None and "in use" in reason  # seen once: maybe a crashed one's
        probe(first)
        probe(twin)
        with pytest.raises(StartupError, match="node name 'pi' is in use"):
            twin.hold_off()
        assert first.hold_off() is None
    finally:
        for p in (first, twin):
            p.close()
            p.member.close()


def test_ntfy_s_request_bucket_running_dry_is_no_reason_to_call_a_node_unready(
    tmp_path: Path,
) -> None:
    """ntfy counts every request against the address's bucket (60, one back per 5 s): a 429 says
    the route, the server and the credentials work; the node would get its stream within one
    replenish period."""
    config = EmulatorConfig(request_limit_burst=1, request_limit_replenish=3600.0)
    with NtfyEmulator(config).running() as emulator:
        prober = prober_for(tmp_path, emulator.url)
        try:
            probe(prober, first=True)  # the bucket's one token
            assert prober.not_ready_reason() is None
            probe(prober)  # 429 42901
            assert prober.not_ready_reason() is None
        finally:
            prober.close()
            prober.member.close()


def test_a_leader_whose_stream_is_live_spends_no_request_of_ntfy_s_bucket(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    prober = prober_for(tmp_path, dead)
    prober.work_state = lambda: WorkState("live", 0.0)
    try:
        probe(prober, first=True)
        assert prober.not_ready_reason() is None, "the live stream is the probe"
        assert stored(prober).intake == "live"
        prober.work_state = lambda: WorkState("dead", 0.0)
        probe(prober)
        assert "ntfy unreachable" in (prober.not_ready_reason() or "")
    finally:
        prober.close()
        prober.member.close()
