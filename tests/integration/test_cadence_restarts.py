"""Cadence survives redeploys: the seed incident, cooldown and debounce across restarts, backlogs.

The daemon runs as a real subprocess; between incidents it is stopped with SIGTERM or killed
with SIGKILL. Cadence state exists only as the audit log, rebuilt at every start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ntfy_intake.testbed import receiver, signal_standin
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import (
    DaemonThread,
    daemon_process,
    env_for,
    event_ids,
    query,
    settings_for,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.engines]


def owner_env(signal_url: str) -> dict[str, str]:
    return {
        "owner_signal_url": signal_url,
        "owner_signal_number": "+31600000000",
        "owner_recipients": "+31600000001",
    }


def stop(proc: subprocess.Popen[bytes], how: str) -> None:
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    else:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_seed_incident_daily_cap_holds_across_sigterm_and_kill9_redeploys(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Failure mode: cadence kept in memory lets a capped alert through once per redeploy."""
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage, signal_standin.running() as sig:
        env = env_for(
            emu.url,
            state,
            relay_url=triage.url,
            cadence_debounce="0s",
            cadence_daily_cap="2",
            **owner_env(sig.url),
        )
        for n, how in enumerate(["sigterm", "kill9", "sigterm", "kill9", "sigterm"]):
            with daemon_process(env) as proc:
                emu.wait_for_subscribers(1, timeout=30)
                emu.publish("alerts", f"incident {n} is on fire", title=f"Incident {n}", priority=5)
                # Triaged, and the agent's reply went through the owner queue (queued or capped).
                wait_until(lambda n=n: len(receiver.receipts(triage.db_path)) == n + 1, timeout=20)
                wait_until(
                    lambda n=n: (
                        query(state, "SELECT count(*) FROM owner_outbox WHERE kind = 'triage'")
                        == [(n + 1,)]
                    ),
                    timeout=20,
                )
                wait_until(
                    lambda: (
                        query(
                            state,
                            "SELECT count(*) FROM owner_outbox WHERE kind = 'triage' AND state IN ('pending', 'leased')",
                        )
                        == [(0,)]
                    ),
                    timeout=20,
                )
                stop(proc, how)
        assert len(receiver.receipts(triage.db_path)) == 5  # all five were triaged
        texts = [m.message for m in sig.messages()]
    assert len(texts) == 2, texts  # and at most daily_cap reached the owner
    assert query(
        state,
        "SELECT state, count(*) FROM owner_outbox WHERE kind = 'triage' GROUP BY state ORDER BY state",
    ) == [("sent", 2), ("suppressed", 3)]


def test_cooldown_survives_a_kill9_restart(emu: NtfyEmulator, tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = env_for(emu.url, state, cadence_debounce="0s", cadence_cooldown="1h")
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        first = emu.publish("alerts", "disk full", title="Disk full")["id"]
        wait_until(lambda: first in event_ids(state))
        stop(proc, "kill9")
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        again = emu.publish("alerts", "disk full again", title="Disk full")["id"]
        wait_until(lambda: again in event_ids(state))
        stop(proc, "sigterm")
    rows = query(state, "SELECT event_id, outcome, reason FROM inbox ORDER BY seq")
    assert rows == [(first, "triage_requested", "new_incident"), (again, "suppressed", "cooldown")]


# Longer than a kill -9 restart takes under the parallel suite's load (a 4 s window was closed
# before the restarted daemon subscribed: the second alert opened a request of its own).
RESTART_DEBOUNCE_S = 20


def test_debounce_window_survives_a_kill9_restart(emu: NtfyEmulator, tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = env_for(emu.url, state, cadence_debounce=f"{RESTART_DEBOUNCE_S}s")
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        first = emu.publish("alerts", "disk 97%", title="Disk full")["id"]
        wait_until(lambda: first in event_ids(state))
        stop(proc, "kill9")
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1, timeout=30)
        second = emu.publish("alerts", "disk 99%", title="Disk full", priority=5)["id"]
        wait_until(lambda: second in event_ids(state))
        assert query(state, "SELECT outcome FROM inbox ORDER BY seq") == [
            ("triage_requested",),
            ("joined",),
        ]
        # The restarted daemon releases the request when the window it did not open closes.
        ((closes,),) = query(state, "SELECT due_at FROM outbox")
        wait_until(
            lambda: query(state, "SELECT state FROM outbox") == [("skipped",)],
            timeout=max(0.0, closes - time.time()) + 30,
        )
        stop(proc, "sigterm")
    assert query(state, "SELECT outcome, delivery_key FROM inbox ORDER BY seq") == [
        ("triage_requested", f"tri_{first}"),
        ("joined", f"tri_{first}"),
    ]
    assert query(state, "SELECT count(*) FROM outbox_events") == [(2,)]


def test_three_hour_backlog_after_downtime_is_one_request_per_incident(tmp_path: Path) -> None:
    """Failure mode: a post-downtime backlog becomes a storm of triage requests."""
    clock = {"now": time.time()}
    with NtfyEmulator(
        EmulatorConfig(keepalive_interval=1.0, clock=lambda: clock["now"])
    ).running() as emu:
        config = settings_for(emu.url, tmp_path, cadence_debounce="2m", cadence_cooldown="1h")
        with DaemonThread(config):
            emu.wait_for_subscribers(1)
            before = emu.publish("alerts", "last alert before the downtime", title="Earlier")["id"]
            wait_until(lambda: before in event_ids(tmp_path))
        published = []
        for minute in range(0, 180, 5):  # the daemon is down for three hours
            clock["now"] += 300
            for incident in ("Disk full", "Backup stale", "UPS on battery"):
                published.append(
                    emu.publish("alerts", f"{incident} at +{minute} min", title=incident)["id"]
                )
        with DaemonThread(config):
            wait_until(lambda: set(published) <= set(event_ids(tmp_path)), timeout=30)
    backlog = ",".join(f"'{i}'" for i in published)
    outcomes = query(
        tmp_path,
        f"SELECT outcome, count(*) FROM inbox WHERE event_id IN ({backlog}) GROUP BY outcome ORDER BY outcome",
    )
    assert outcomes == [("joined", len(published) - 3), ("triage_requested", 3)]
    assert query(
        tmp_path, "SELECT count(*) FROM outbox WHERE incident_key != 'alerts:earlier'"
    ) == [(3,)]
