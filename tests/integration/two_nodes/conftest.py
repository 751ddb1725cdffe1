"""What every two-node test shares (DESIGN.md section 9): an emulator, a receiver that tags
each POST with the node that sent it, and the cluster on this test's PostgreSQL schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

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
