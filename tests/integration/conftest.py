"""Fixtures several integration modules share: the owner tests' store, the Signal stand-in and
the reference triage receiver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake.store import db
from ntfy_intake.testbed import receiver, signal_standin
from ntfy_intake.testbed.receiver import ReceiverHandle
from ntfy_intake.testbed.signal_standin import SignalHandle


@pytest.fixture
def conn(store: db.Connection) -> db.Connection:
    """The test's migrated store on its engine (tests/conftest.py `store`)."""
    return store


@pytest.fixture(scope="module")
def shared_signal() -> Iterator[SignalHandle]:
    """One signal-cli-rest-api stand-in per module: starting one per test costs more than the
    tests; `signal` resets it between them."""
    with signal_standin.running() as handle:
        yield handle


@pytest.fixture
def signal(shared_signal: SignalHandle) -> SignalHandle:
    shared_signal.reset()
    return shared_signal


@pytest.fixture
def triage(tmp_path: Path) -> Iterator[ReceiverHandle]:
    """The reference triage receiver, answering 2xx, its receipts in the test's directory."""
    with receiver.running(tmp_path / "receiver.sqlite3") as handle:
        yield handle
