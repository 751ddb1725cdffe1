"""Escalation when the agent feed is the only consumer (DESIGN.md section 13: "Off for the agent
feed unless `feed` is the only consumer and `escalate_after` is set: then 'no ack by the handle
within escalate_after'"), against the real daemon on both engines: no relay, the feed handle
named by `relay.escalate_handle`, the Signal stand-in; the agent acks through the same store
the feed CLI and HTTP API use.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake import settings
from ntfy_intake.store.feed import FeedStore
from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.testbed.signal_standin import SignalHandle

from ..harness import DaemonThread, env_for, query, store_of, wait_until

pytestmark = pytest.mark.engines

# What the message says with the feed alone: nothing was pushed that could stay silent.
SILENT = "triage agent has not taken it from the feed for"


@pytest.fixture
def sig() -> Iterator[SignalHandle]:
    with signal_standin.running() as handle:
        yield handle


def config(emu: NtfyEmulator, state: Path, sig: SignalHandle, after: str) -> Any:
    return settings.load(
        None,
        env_for(
            emu.url,
            state,
            cadence_debounce="0s",
            relay_escalate_after=after,
            relay_escalate_handle="triager",
            owner_signal_url=sig.url,
            owner_signal_number="+31600000000",
            owner_recipients="+31600000001",
        ),
    )


def escalation_rows(state: Path) -> list[tuple[str, str]]:
    return query(state, "SELECT key, state FROM owner_outbox WHERE key LIKE 'escalate:%'")


def test_feed_agent_that_never_acks_gets_the_owner_told_once(
    emu: NtfyEmulator, tmp_path: Path, sig: SignalHandle
) -> None:
    """Failure mode: the only agent pulls the feed and has died; with no relay nothing ever
    escalates, and the alert reaches nobody."""
    state = tmp_path / "state"
    with DaemonThread(config(emu, state, sig, "1s")):
        emu.wait_for_subscribers(1, timeout=30)
        emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
        wait_until(
            lambda: any(SILENT in m.message for m in sig.messages()),
            timeout=30,
            what="the escalation at Signal",
        )
        time.sleep(2.0)  # a second one would be due by now
        rows = escalation_rows(state)
        request = query(state, "SELECT delivery_key, state FROM outbox")
    assert [r[1] for r in rows] == ["sent"]
    [(key, request_state)] = request
    assert request_state == "skipped" and rows[0][0] == f"escalate:{key}"
    escalations = [m.message for m in sig.messages() if SILENT in m.message]
    assert len(escalations) == 1 and "Disk full on nas" in escalations[0]


def test_feed_agent_that_acks_in_time_gets_no_escalation(
    emu: NtfyEmulator, tmp_path: Path, sig: SignalHandle
) -> None:
    state = tmp_path / "state"
    with DaemonThread(config(emu, state, sig, "4s")):
        emu.wait_for_subscribers(1, timeout=30)
        with FeedStore.open(store_of(state)) as feed:
            feed.subscribe("triager", at="start")
            emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
            wait_until(lambda: feed.catch_up("triager"), timeout=30, what="the feed entry")
            [entry] = feed.catch_up("triager")
            feed.ack("triager", entry.channel, entry.seq)  # handled, in time
        time.sleep(5.0)  # past escalate_after
        rows = escalation_rows(state)
    assert rows == []
    assert not any(SILENT in m.message for m in sig.messages())
