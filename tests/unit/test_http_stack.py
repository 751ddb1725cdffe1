"""The HTTP stack's own costs that the daemon pays per request."""

from __future__ import annotations

import asyncio
import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType

from httpcore import _synchronization


class _Lookups(importlib.abc.MetaPathFinder):
    """Records every module name the import system had to search for."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        self.names.append(fullname)


def test_httpcore_request_setup_does_not_search_sys_path_for_sniffio_every_time() -> None:
    """httpcore imports `sniffio` inside `current_async_library()`, called several times per
    request; since anyio 4.11 no longer pulls sniffio in, each call was a failed import that
    searched all of sys.path again (~150 us a request, encode/httpcore#1102). The project
    depends on sniffio so that the import is a dictionary lookup."""
    lookups = _Lookups()

    async def setup_many() -> list[str]:
        return [_synchronization.current_async_library() for _ in range(5)]

    asyncio.run(setup_many())  # the first call may import it for real
    sys.meta_path.insert(0, lookups)
    try:
        found = asyncio.run(setup_many())
    finally:
        sys.meta_path.remove(lookups)
    assert found == ["asyncio"] * 5
    assert "sniffio" not in lookups.names
