"""Every test here runs twice: against the bundled emulator and against the real ntfy server;
except the section-11 checklist (test_both_servers.py), whose emulator run is
tests/emulator/test_conformance.py."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..servers import Server, start


@pytest.fixture(params=["emulator", pytest.param("real", marks=pytest.mark.real_ntfy)])
def kind(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def make_server(kind: str, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    with contextlib.ExitStack() as stack:

        def make(**options: Any) -> Server:
            directory = tmp_path / f"server-{len(stack._exit_callbacks)}"
            return stack.enter_context(start(kind, directory, **options))

        yield make


@pytest.fixture
def server(make_server: Callable[..., Server]) -> Server:
    return make_server()
