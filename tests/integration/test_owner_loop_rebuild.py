"""The owner's replies across a rebuild from the audit log (DESIGN.md sections 4 and 13): the
real daemon on both engines, the emulator, a triage agent asking to tell the owner, the
signal-cli-rest-api stand-in serving the owner's replies. The store is lost between two runs,
its audit log kept.

Each test is named after the failure it kills.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake import settings
from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.testbed.receiver import ReceiverHandle
from ntfy_intake.testbed.signal_standin import SignalHandle

from ..harness import DaemonThread, env_for, query, wait_until, wipe_store

pytestmark = pytest.mark.engines

SENDER = "+31600000000"
OWNER = "+31600000001"


@pytest.fixture
def sig() -> Iterator[SignalHandle]:
    with signal_standin.running() as handle:
        yield handle


def config(
    emu: NtfyEmulator, state: Path, triage: ReceiverHandle, sig: SignalHandle, **more: str
) -> Any:
    """The owner loop's daemon (relay, Signal sender, poll receive); `more`: other settings."""
    return settings.load(
        None,
        env_for(
            emu.url,
            state,
            **more,
            relay_url=triage.url,
            cadence_debounce="0s",
            cadence_cooldown="0s",  # every event a request: every one could reach the owner
            owner_signal_url=sig.url,
            owner_signal_number=SENDER,
            owner_recipients=OWNER,
            owner_receive="poll",
            owner_receive_every="1s",
        ),
    )


def triage_rows(state: Path, title: str) -> list[tuple[str, str | None]]:
    """The owner messages about the incident titled `title`, oldest first."""
    try:
        return query(
            state,
            "SELECT w.state, w.last_error FROM owner_outbox w"
            " WHERE w.kind = 'triage' AND w.text LIKE ? ORDER BY w.created_at, w.key",
            f"%{title}%",
        )
    except Exception:  # the store is being created by the daemon
        return []


def alert(emu: NtfyEmulator, state: Path, title: str, n: int) -> None:
    emu.publish("alerts", f"{title} number {n}", title=title, priority=5)
    wait_until(lambda: len(triage_rows(state, title)) == n, timeout=30, what=f"{title} message {n}")


def reply(sig: SignalHandle, about: str, text: str, confirmed: str) -> None:
    """The owner swipes the message about `about` and types `text`; wait for the confirmation."""
    wait_until(lambda: any(about in m.message for m in sig.messages()), timeout=30, what="sent")
    sent = next(m for m in sig.messages() if about in m.message)
    sig.inbox.inject(SENDER, OWNER, text, quote=sent.timestamp)
    wait_until(
        lambda: any(m.message.startswith(confirmed) for m in sig.messages()),
        timeout=30,
        what=f"the {text!r} confirmation",
    )


def test_ack_and_a_reply_silence_survive_a_rebuild_from_the_audit_log(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    """Failure mode: the database is lost and rebuilt from the audit log; the `owner_reply`
    lines are there but not folded, so the owner, who acked, is messaged about it again."""
    state = tmp_path / "state"
    settings_ = config(emu, state, triage, sig)
    with DaemonThread(settings_):
        emu.wait_for_subscribers(1, timeout=30)
        alert(emu, state, "Disk full", 1)
        alert(emu, state, "CPU hot", 1)
        reply(sig, "Disk full", "ack", "Acknowledged")
        reply(sig, "CPU hot", "silence 2h", "Silenced")
    wipe_store(state)
    with DaemonThread(settings_):
        emu.wait_for_subscribers(1, timeout=30)
        wait_until(
            lambda: len(triage_rows(state, "Disk full")) == 1, timeout=30, what="the rebuild"
        )
        alert(emu, state, "Disk full", 2)
        alert(emu, state, "CPU hot", 2)
        alert(emu, state, "Fan stopped", 1)  # another incident still reaches the owner
        acks = query(state, "SELECT count(*) FROM owner_acks")
    assert triage_rows(state, "Disk full")[1] == ("suppressed", "acknowledged")
    assert triage_rows(state, "CPU hot")[1] == ("suppressed", "silenced")
    assert triage_rows(state, "Fan stopped")[0][1] is None
    assert acks == [(1,)]


def escalation_rows(state: Path) -> list[tuple[str, str, str | None]]:
    try:
        return query(
            state,
            "SELECT w.text, w.state, w.last_error FROM owner_outbox w"
            " WHERE w.key LIKE 'escalate:%' ORDER BY w.created_at, w.key",
        )
    except Exception:  # the store is being created by the daemon
        return []


def test_escalations_count_once_against_the_daily_cap_across_a_rebuild(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    """Failure modes: the rebuilt store forgets the day's escalations (the cap lets a third one
    through) or counts one twice (the rebuilt row and its audit line: the second is held)."""
    state = tmp_path / "state"
    triage.faults.fail_next(100_000, status=503)  # the agent is silent throughout
    env = env_for(
        emu.url,
        state,
        relay_url=triage.url,
        relay_max_attempts="1000",
        relay_escalate_after="1s",
        relay_escalate_daily_cap="2",
        cadence_debounce="0s",
        owner_signal_url=sig.url,
        owner_signal_number=SENDER,
        owner_recipients=OWNER,
    )
    settings_ = settings.load(None, env)
    with DaemonThread(settings_):
        emu.wait_for_subscribers(1, timeout=30)
        emu.publish("alerts", "disk at 99%", title="Disk full", priority=5)
        wait_until(lambda: [r[1] for r in escalation_rows(state)] == ["sent"], timeout=30)
    wipe_store(state)
    with DaemonThread(settings_):
        emu.wait_for_subscribers(1, timeout=30)
        wait_until(lambda: len(escalation_rows(state)) == 1, timeout=30, what="the rebuild")
        emu.publish("alerts", "cpu at 99C", title="CPU hot", priority=5)
        wait_until(lambda: len(escalation_rows(state)) == 2, timeout=30, what="the second")
        emu.publish("alerts", "fan at 0 rpm", title="Fan stopped", priority=5)
        wait_until(lambda: len(escalation_rows(state)) == 3, timeout=30, what="the third")
        rows = escalation_rows(state)
    # The second one may still be on its way to Signal: what matters is that it was let through.
    assert [(r[1], r[2]) for r in rows] == [
        ("sent", None),
        (rows[1][1] if rows[1][1] in ("pending", "sent") else "?", None),
        ("suppressed", "escalate_daily_cap"),
    ]
    assert ["Disk full" in rows[0][0], "CPU hot" in rows[1][0], "Fan stopped" in rows[2][0]] == [
        True
    ] * 3
    assert sum("Disk full" in m.message for m in sig.messages()) == 1


def test_reply_quoting_a_message_sent_before_a_rebuild_still_finds_its_incident(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    """Failure mode: after the rebuild the daemon no longer knows the Signal timestamps of what
    it sent, so the owner's ack of the message on his screen gets "That quote is not one of my
    messages" and the incident goes on messaging him."""
    state = tmp_path / "state"
    settings_ = config(emu, state, triage, sig)
    with DaemonThread(settings_):
        emu.wait_for_subscribers(1, timeout=30)
        alert(emu, state, "Disk full", 1)
        wait_until(lambda: any("Disk full" in m.message for m in sig.messages()), timeout=30)
    wipe_store(state)
    with DaemonThread(settings_):
        emu.wait_for_subscribers(1, timeout=30)
        wait_until(
            lambda: len(triage_rows(state, "Disk full")) == 1, timeout=30, what="the rebuild"
        )
        reply(sig, "Disk full", "ack", "Acknowledged")
        alert(emu, state, "Disk full", 2)
    assert triage_rows(state, "Disk full")[1] == ("suppressed", "acknowledged")
