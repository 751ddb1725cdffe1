"""A running daemon maps the PostgreSQL driver's libraries only when its store is PostgreSQL
(issue 36's peak RSS < 80 MB: libpq and its libraries cost a SQLite daemon ~10 MB for nothing;
docs/performance.md, Memory). Both engines: the PostgreSQL run is the precondition that the
check can see the driver at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import NtfyEmulator

from .. import harness
from ..harness import daemon_process, env_for, event_ids, wait_until

pytestmark = pytest.mark.engines


def test_a_sqlite_daemon_maps_no_postgresql_driver(emu: NtfyEmulator, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with daemon_process(env_for(emu.url, state)) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        published = emu.publish("alerts", "disk 91%", title="Disk")["id"]
        wait_until(lambda: published in event_ids(state), timeout=30, what="recorded")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
    libpq = "libpq" in maps
    assert libpq == (harness.DATABASE is not None), "libpq mapped" if libpq else "no libpq"
