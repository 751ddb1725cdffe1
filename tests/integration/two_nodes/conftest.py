"""What every two-node test shares (DESIGN.md section 9): an emulator, a receiver that tags
each POST with the node that sent it, the cluster on this test's PostgreSQL schema, each node's
own route to ntfy, and a PostgreSQL server of a test's own for the tests that restart it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake.testbed import drill_store
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.testbed.ntfy_route import NtfyRoute

from ... import harness
from ...standby import Cluster
from ...standby_nodes import TaggedReceiver


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emulator:
        yield emulator


@pytest.fixture
def tagged(tmp_path: Path) -> Iterator[TaggedReceiver]:
    with TaggedReceiver(tmp_path / "receiver.sqlite3").running() as running:
        yield running


@pytest.fixture
def cluster(tmp_path: Path, emu: NtfyEmulator, tagged: TaggedReceiver) -> Iterator[Cluster]:
    assert harness.DATABASE is not None
    nodes = Cluster(tmp_path, harness.DATABASE, emu, tagged)
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def routes(cluster: Cluster) -> Iterator[dict[str, NtfyRoute]]:
    """alpha's and beta's own routes to ntfy (testbed/ntfy_route.py), each one the test can cut."""
    made = {name: NtfyRoute(cluster.emu.url, name) for name in ("alpha", "beta")}
    try:
        yield made
    finally:
        for route in made.values():
            route.close()


@pytest.fixture
def own_server() -> Iterator[tuple[str, Path]]:
    """A PostgreSQL cluster of this test's own (scripts/pg-cluster): (a DSN of a fresh schema
    in it, its data dir). Others share the suite's server; only this one may be restarted or
    stopped."""
    script = Path(__file__).resolve().parents[3] / "scripts" / "pg-cluster"
    directory = Path(tempfile.mkdtemp(prefix="two-nodes-pg-", dir="/tmp"))
    started = subprocess.run(
        [str(script), "start", str(directory)], capture_output=True, text=True, check=False
    )
    try:
        if started.returncode == 3:
            pytest.skip(f"scripts/pg-cluster: {started.stderr.strip()}")
        assert started.returncode == 0, started.stderr
        _, dsn = drill_store.create_schema(started.stdout.strip().splitlines()[-1], prefix="t")
        yield dsn, directory / "data"
    finally:
        subprocess.run([str(script), "stop", str(directory)], check=False, timeout=90)
        shutil.rmtree(directory, ignore_errors=True)
