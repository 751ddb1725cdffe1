"""Fixtures several integration modules share: the owner tests' store and Signal stand-in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ntfy_intake.store import db
from ntfy_intake.testbed import signal_standin
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
