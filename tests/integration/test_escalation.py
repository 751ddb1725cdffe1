"""Escalation when the triage agent is silent (DESIGN.md section 13), against the real daemon on
both engines: real sockets to the emulator, the triage receiver (answering 503) and the Signal
stand-in; a real subprocess killed with SIGKILL for the crash.

`relay.escalate_after` is 2 s here so nothing waits ten minutes. The rule's edges (the exact due
instant, the 300-character bound, sanitizing) are proven with an injected clock in
tests/unit/test_escalation.py.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake import settings
from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.testbed.receiver import ReceiverHandle
from ntfy_intake.testbed.signal_standin import SignalHandle

from ..harness import (
    DaemonThread,
    audit_records,
    daemon_process,
    env_for,
    query,
    wait_until,
    wipe_store,
)

pytestmark = pytest.mark.engines

SILENT = "triage agent silent"
AFTER = 2.0


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emulator:
        yield emulator


@pytest.fixture
def sig() -> Iterator[SignalHandle]:
    with signal_standin.running() as handle:
        yield handle


def env(
    emu: NtfyEmulator, state: Path, triage: ReceiverHandle, sig: SignalHandle, **more: str
) -> dict[str, str]:
    return env_for(
        emu.url,
        state,
        cadence_debounce="0s",
        relay_url=triage.url,
        relay_max_attempts="1000",
        relay_escalate_after=f"{AFTER:g}s",
        owner_signal_url=sig.url,
        owner_signal_number="+31600000000",
        owner_recipients="+31600000001",
        **more,
    )


def escalations(sig: SignalHandle) -> list[str]:
    return [m.message for m in sig.messages() if SILENT in m.message]


def escalation_rows(state: Path) -> list[tuple[str, str, str | None]]:
    return query(
        state,
        "SELECT key, state, last_error FROM owner_outbox WHERE key LIKE 'escalate:%' ORDER BY key",
    )


def settle(seconds: float) -> None:
    """Let the daemon run past a due instant it must NOT act on (negative tests only)."""
    time.sleep(seconds)


def test_silent_agent_escalates_once_to_the_owner_naming_the_alert(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    state = tmp_path / "state"
    triage.faults.fail_next(100_000, status=503)
    started = time.monotonic()
    with DaemonThread(settings.load(None, env(emu, state, triage, sig))):
        emu.wait_for_subscribers(1, timeout=30)
        emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
        wait_until(lambda: escalations(sig), timeout=30, what="the escalation at Signal")
        assert time.monotonic() - started >= AFTER
        settle(AFTER + 1.0)  # a second one would be due by now
        sent = escalations(sig)
        rows = escalation_rows(state)
        # The request is still being retried, not given up on.
        retried = query(state, "SELECT state, attempts FROM outbox")
    assert len(sent) == 1
    assert "Disk full on nas" in sent[0] and "severity 5" in sent[0] and "[alerts]" in sent[0]
    assert len(sent[0]) <= 300
    assert [(r[1], r[2]) for r in rows] == [("sent", None)]
    assert rows[0][0].startswith("escalate:tri_")
    [(request_state, attempts)] = retried
    assert request_state in ("pending", "leased") and attempts >= 2
    audited = [
        r
        for r in audit_records(state)
        if r["kind"] == "owner_message" and r.get("message_kind") == "escalation"
    ]
    assert [(r["key"], r["result"]) for r in audited] == [(rows[0][0], "queued")]


def test_agent_answering_in_time_gets_no_escalation(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    state = tmp_path / "state"
    with DaemonThread(settings.load(None, env(emu, state, triage, sig))):
        emu.wait_for_subscribers(1, timeout=30)
        emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
        wait_until(
            lambda: query(state, "SELECT state FROM outbox") == [("delivered",)],
            timeout=30,
            what="the request delivered",
        )
        settle(AFTER + 2.0)
        rows = escalation_rows(state)
    assert rows == []
    assert escalations(sig) == []


def test_alert_below_the_minimum_severity_does_not_escalate(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    state = tmp_path / "state"
    triage.faults.fail_next(100_000, status=503)
    with DaemonThread(settings.load(None, env(emu, state, triage, sig))):
        emu.wait_for_subscribers(1, timeout=30)
        emu.publish("alerts", "backup slow", title="Backup slow", priority=3)
        wait_until(
            lambda: query(state, "SELECT count(*) FROM outbox WHERE attempts >= 1") == [(1,)],
            timeout=30,
            what="the request attempted",
        )
        settle(AFTER + 2.0)
        rows = escalation_rows(state)
    assert rows == []
    assert escalations(sig) == []


def test_escalation_daily_cap_holds_and_leaves_the_triage_cap_alone(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    state = tmp_path / "state"
    triage.faults.fail_next(100_000, status=503)
    config = env(emu, state, triage, sig, relay_escalate_daily_cap="1", cadence_daily_cap="0")
    with DaemonThread(settings.load(None, config)):
        emu.wait_for_subscribers(1, timeout=30)
        emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
        emu.publish("backups", "backup failed", title="Backup failed", priority=4)
        wait_until(
            lambda: len(escalation_rows(state)) == 2, timeout=30, what="both escalations decided"
        )
        wait_until(lambda: escalations(sig), timeout=30, what="the one escalation sent")
        settle(1.0)
        rows = escalation_rows(state)
        sent = escalations(sig)
    # cadence.daily_cap = 0 would suppress every triage reply: escalations count apart.
    assert sorted((r[1], r[2]) for r in rows) == [
        ("sent", None),
        ("suppressed", "escalate_daily_cap"),
    ]
    assert len(sent) == 1


def test_kill9_after_the_escalation_is_recorded_still_sends_it_exactly_once(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    state = tmp_path / "state"
    triage.faults.fail_next(100_000, status=503)
    config = env(emu, state, triage, sig)
    crash = {"NTFY_INTAKE_TEST_CRASH_AT": "after_escalation_record"}
    with daemon_process(config, extra_env=crash) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    assert escalations(sig) == []  # died after COMMIT, before the send
    assert [(r[1]) for r in escalation_rows(state)] == ["pending"]
    with daemon_process(config):
        emu.wait_for_subscribers(1, timeout=30)
        wait_until(lambda: escalations(sig), timeout=30, what="the escalation sent after restart")
        settle(AFTER + 1.0)
        sent = escalations(sig)
        rows = escalation_rows(state)
    assert len(sent) == 1 and "Disk full on nas" in sent[0]
    assert [(r[1], r[2]) for r in rows] == [("sent", None)]


def stop_failing(triage: ReceiverHandle) -> None:
    while triage.faults.take_injected() is not None:
        pass


def test_agent_answering_after_the_escalation_still_reaches_the_owner(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    state = tmp_path / "state"
    triage.faults.fail_next(100_000, status=503)
    with DaemonThread(settings.load(None, env(emu, state, triage, sig))):
        emu.wait_for_subscribers(1, timeout=30)
        emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
        wait_until(lambda: escalations(sig), timeout=30, what="the escalation at Signal")
        stop_failing(triage)  # the agent is back
        wait_until(
            lambda: [m for m in sig.messages() if m.message.startswith("[sev 5]")],
            timeout=30,
            what="the agent's own reply at Signal",
        )
        outbox = query(state, "SELECT state FROM outbox")
        sent = escalations(sig)
    assert outbox == [("delivered",)]
    assert len(sent) == 1


def rebuilt(state: Path) -> bool:
    try:
        return query(state, "SELECT count(*) FROM outbox") == [(1,)]
    except Exception:  # the store is being created by the daemon
        return False


def test_rebuild_from_the_audit_log_does_not_escalate_the_same_request_again(
    emu: NtfyEmulator, tmp_path: Path, triage: ReceiverHandle, sig: SignalHandle
) -> None:
    state = tmp_path / "state"
    triage.faults.fail_next(100_000, status=503)
    config = settings.load(None, env(emu, state, triage, sig))
    with DaemonThread(config):
        emu.wait_for_subscribers(1, timeout=30)
        emu.publish("alerts", "nas disk at 99%", title="Disk full on nas", priority=5)
        wait_until(lambda: escalations(sig), timeout=30, what="the escalation at Signal")
        wait_until(lambda: [r[1] for r in escalation_rows(state)] == ["sent"], timeout=30)
        [(key, _, _)] = escalation_rows(state)
    wipe_store(state)
    with DaemonThread(config):
        wait_until(lambda: rebuilt(state), timeout=30, what="the request rebuilt")
        settle(AFTER + 2.0)
        rows = escalation_rows(state)
        requests = query(state, "SELECT state FROM outbox")
    assert requests[0][0] in ("pending", "leased")  # still unanswered, still retried
    assert [(r[0], r[1]) for r in rows] == [(key, "sent")]
    assert len(escalations(sig)) == 1
