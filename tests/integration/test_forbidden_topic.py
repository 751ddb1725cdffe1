"""One forbidden topic never blinds the others (DESIGN.md section 12), over real loopback
sockets: the emulator's token ACLs, and the real ntfy server's `auth-file` where it can run.

ntfy refuses a whole multi-topic subscribe (403 40301) when any one topic is not readable."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import (
    DaemonThread,
    audit_records,
    cursor_row,
    event_ids,
    notices,
    settings_for,
    wait_until,
)
from ..real_ntfy import RealNtfy

TOKEN = "tk_" + "a" * 29


def backfills(state_dir: Path) -> int:
    return sum(1 for r in audit_records(state_dir) if r["kind"] == "backfill")


def streams_of(log: list[dict[str, object]]) -> list[str]:
    """The paths of the streaming (non-poll) subscribes that were answered 200."""
    return [
        str(e["path"])
        for e in log
        if not e["params"].get("poll") and e.get("status") == 200  # type: ignore[attr-defined]
    ]


@pytest.mark.one_engine("intake's topic set and notices; the store's path is the usual one")
def test_a_forbidden_topic_does_not_blind_intake_for_the_others(tmp_path: Path) -> None:
    readable = {"alerts"}  # `backups` is forbidden to the daemon's token
    clock = {"now": time.time()}
    with NtfyEmulator(
        EmulatorConfig(
            keepalive_interval=1.0,
            tokens={TOKEN: readable},
            request_limit=False,
            clock=lambda: clock["now"],
            manager_interval=None,
        )
    ).running() as emu:
        config = settings_for(emu.url, tmp_path, ntfy_token=TOKEN)
        with DaemonThread(config) as running:
            emu.wait_for_subscribers(1, topic="alerts")
            live = [emu.publish("alerts", f"disk {i}", title=f"disk {i}")["id"] for i in range(3)]
            wait_until(lambda: set(live) <= set(event_ids(tmp_path)), what="alerts recorded")
            wait_until(lambda: notices(tmp_path, "topic_refused"), what="topic notice")
            # The first stream's own overlap backfill is done: nothing older is owed any more.
            wait_until(lambda: backfills(tmp_path) >= 1, what="first backfill recorded")
            # Published while forbidden: ntfy holds it; it must come in once access returns.
            held = emu.publish("backups", "nightly backup failed", title="backup failed")["id"]
            # ntfy's clock moves on past the overlap (30 s): only the reach-back to when
            # `backups` was dropped can find what was published to it before the cursor moved.
            clock["now"] += 120
            # An alert after it moves the id cursor past it: a resume from the cursor alone
            # (`since=<id>` is exclusive) cannot see `held`; the backfill must reach back.
            moved = emu.publish("alerts", "disk 3", title="disk 3")["id"]
            wait_until(lambda: cursor_row(tmp_path) == ("id", moved), what="cursor past held")
            readable.add("backups")  # the owner fixes the ACL
            wait_until(
                lambda: held in event_ids(tmp_path), timeout=60, what="backups backlog recorded"
            )
            after = emu.publish("backups", "backup ok", title="backup ok")["id"]
            wait_until(lambda: after in event_ids(tmp_path), what="backups streamed again")
            assert running.daemon is not None
        (notice,) = notices(tmp_path, "topic_refused")
        assert notice["topic"] == "backups"
        assert "'backups'" in str(notice["text"]) and "40301: forbidden" in str(notice["text"])
        assert notices(tmp_path, "subscribe_refused") == []
        paths = streams_of(emu.subscribe_log)
        assert "/alerts/json" in paths and paths[-1] == "/alerts,backups/json", paths


@pytest.mark.one_engine("intake's topic set; no store behaviour under test")
def test_every_topic_forbidden_is_one_whole_refusal_not_a_split(tmp_path: Path) -> None:
    readable: set[str] = set()
    with NtfyEmulator(
        EmulatorConfig(keepalive_interval=1.0, tokens={TOKEN: readable}, request_limit=False)
    ).running() as emu:
        config = settings_for(emu.url, tmp_path, ntfy_token=TOKEN)
        with DaemonThread(config):
            wait_until(lambda: notices(tmp_path, "subscribe_refused"), what="refusal notice")
            readable.update({"alerts", "backups"})
            emu.wait_for_subscribers(1, topic="backups")
    assert notices(tmp_path, "topic_refused") == []
    (notice,) = notices(tmp_path, "subscribe_refused")
    assert notice["category"] == "acl"


@pytest.mark.real_ntfy
@pytest.mark.one_engine("the real server's ACL answer; no store behaviour under test")
def test_a_forbidden_topic_on_the_real_server_does_not_blind_the_others(
    tmp_path: Path, make_real_ntfy: Callable[..., RealNtfy]
) -> None:
    # write-only by default: anyone may publish, and the daemon's user reads only what it is
    # granted, so `backups` is forbidden to it until the grant below.
    server = make_real_ntfy(auth=True, default_access="write-only")
    server.add_user("intake")
    token = server.add_token("intake")
    server.grant("intake", "alerts", "read-only")
    config = settings_for(server.url, tmp_path, ntfy_token=token)
    with DaemonThread(config):
        wait_until(lambda: notices(tmp_path, "topic_refused"), timeout=60, what="topic notice")
        live = server.publish("alerts", "disk full", Title="disk full")["id"]
        wait_until(lambda: live in event_ids(tmp_path), what="alerts recorded")
        held = server.publish("backups", "backup failed", Title="backup failed")["id"]
        server.grant("intake", "backups", "read-only")
        wait_until(lambda: held in event_ids(tmp_path), timeout=90, what="backups backlog")
    (notice,) = notices(tmp_path, "topic_refused")
    assert notice["topic"] == "backups" and notice["status"] == "403"
