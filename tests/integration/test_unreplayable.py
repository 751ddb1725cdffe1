"""Messages ntfy will not replay (DESIGN.md section 12): a message published with `Cache: no`
has no `expires`, so one disconnect would lose it for good. It is recorded as usual, and the
owner hears once per topic per UTC day, across a restart too (the key names topic and day)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import NtfyEmulator

from ..harness import DaemonThread, event_ids, notices, query, settings_for, wait_until

pytestmark = pytest.mark.engines


def test_uncached_messages_are_recorded_and_noticed_once_per_topic_per_day_across_a_restart(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        normal = emu.publish("alerts", "cached as usual", title="cached")["id"]
        wait_until(lambda: normal in event_ids(tmp_path), what="normal message recorded")
        assert notices(tmp_path, "unreplayable") == []  # a normal message says nothing
        first = emu.publish("alerts", "Gatus: web down", title="web down", cache=False)
        assert "expires" not in first
        second = emu.publish("alerts", "Gatus: api down", title="api down", cache=False)
        other = emu.publish("backups", "nightly failed", title="backup", cache=False)
        ids = [first["id"], second["id"], other["id"]]
        wait_until(lambda: set(ids) <= set(event_ids(tmp_path)), what="uncached recorded")
        wait_until(lambda: len(notices(tmp_path, "unreplayable")) == 2, what="two notices")
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        again = emu.publish("alerts", "Gatus: web down", title="web down", cache=False)["id"]
        wait_until(lambda: again in event_ids(tmp_path), what="uncached after restart")
        marker = emu.publish("alerts", "cached after it", title="marker")["id"]
        wait_until(lambda: marker in event_ids(tmp_path), what="marker recorded")
    told = notices(tmp_path, "unreplayable")
    assert sorted(n["topic"] for n in told) == ["alerts", "backups"], told
    day = told[0]["day"]
    assert {n["key"] for n in told} == {f"unreplayable:alerts:{day}", f"unreplayable:backups:{day}"}
    assert "Cache: no" in str(told[0]["text"])
    rows = query(tmp_path, "SELECT count(*) FROM owner_outbox WHERE key LIKE 'unreplayable:%'")
    assert rows == [(2,)]
