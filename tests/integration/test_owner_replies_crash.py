"""Replies from the phone across kill -9 (DESIGN.md section 13): the daemon as a real
subprocess, the signal-cli-rest-api stand-in answering its sends and serving the owner's
replies through `GET /v1/receive`, a triage agent that asks to tell the owner, both engines.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from ntfy_intake.testbed import receiver, signal_standin
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.testbed.signal_standin import SignalHandle

from ..harness import daemon_process, env_for, query, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.engines]

SENDER = "+31600000000"
OWNER = "+31600000001"


def env(emu: NtfyEmulator, state: Path, triage_url: str, sig: SignalHandle) -> dict[str, str]:
    return env_for(
        emu.url,
        state,
        relay_url=triage_url,
        cadence_debounce="0s",
        cadence_cooldown="0s",  # every event a request: every one could reach the owner
        owner_signal_url=sig.url,
        owner_signal_number=SENDER,
        owner_recipients=OWNER,
        owner_receive="poll",
        owner_receive_every="1s",
    )


def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def triage_rows(state: Path) -> list[tuple[str, str | None]]:
    return query(
        state,
        "SELECT state, last_error FROM owner_outbox WHERE kind = 'triage' ORDER BY created_at",
    )


def alert(emu: NtfyEmulator, state: Path, n: int) -> None:
    emu.publish("alerts", f"disk at 9{n}%", title="Disk full", priority=5)
    wait_until(lambda: len(triage_rows(state)) == n, timeout=30, what=f"owner message {n}")


def test_silence_2h_from_a_reply_holds_across_kill9(emu: NtfyEmulator, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with (
        receiver.running(tmp_path / "receiver.sqlite3") as triage,
        signal_standin.running() as sig,
    ):
        config = env(emu, state, triage.url, sig)
        with daemon_process(config) as proc:
            emu.wait_for_subscribers(1, timeout=30)
            alert(emu, state, 1)
            wait_until(lambda: len(sig.messages()) == 1, timeout=30, what="sent to Signal")
            [sent] = sig.messages()
            sig.inbox.inject(SENDER, OWNER, "silence 2h", quote=sent.timestamp)
            wait_until(
                lambda: any("Silenced" in m.message for m in sig.messages()),
                timeout=30,
                what="the confirmation",
            )
            kill9(proc)
        with daemon_process(config):
            emu.wait_for_subscribers(1, timeout=30)
            alert(emu, state, 2)
    assert triage_rows(state) == [("sent", None), ("suppressed", "silenced")]
    assert query(state, "SELECT command, result FROM owner_replies") == [("silence", "silenced")]


def test_kill9_right_after_a_receive_loses_that_reply_and_a_resend_works(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """The documented cost: signal-cli-rest-api removed the reply when it returned it, and the
    daemon died before committing it. No effect, no confirmation; the owner sends it again."""
    state = tmp_path / "state"
    with (
        receiver.running(tmp_path / "receiver.sqlite3") as triage,
        signal_standin.running() as sig,
    ):
        config = env(emu, state, triage.url, sig)
        crash = {"NTFY_INTAKE_TEST_CRASH_AT": "after_owner_receive"}
        with daemon_process(config, extra_env=crash) as proc:
            emu.wait_for_subscribers(1, timeout=30)
            alert(emu, state, 1)
            wait_until(lambda: len(sig.messages()) == 1, timeout=30, what="sent to Signal")
            [sent] = sig.messages()
            sig.inbox.inject(SENDER, OWNER, "ack", quote=sent.timestamp)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        assert sig.inbox.pending(SENDER) == 0  # taken from the server, never committed
        assert query(state, "SELECT count(*) FROM owner_replies") == [(0,)]
        with daemon_process(config):
            emu.wait_for_subscribers(1, timeout=30)
            sig.inbox.inject(SENDER, OWNER, "ack", quote=sent.timestamp)  # the owner resends
            wait_until(
                lambda: any(m.message.startswith("Acknowledged") for m in sig.messages()),
                timeout=30,
                what="the confirmation",
            )
            alert(emu, state, 2)
        confirmations = [m for m in sig.messages() if m.message.startswith("Acknowledged")]
    assert len(confirmations) == 1
    assert triage_rows(state) == [("sent", None), ("suppressed", "acknowledged")]
    assert query(state, "SELECT command, result FROM owner_replies") == [("ack", "acknowledged")]
