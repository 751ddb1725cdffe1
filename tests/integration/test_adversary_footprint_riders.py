"""Adversary of the rides that wait (issue 36, fcc7d4e/d2565b0): on SQLite an owed write (the
audit mark with its journal trim, the health snapshot, the last frame time) is carried by a batch
only once owed `RIDE_AFTER_S`, otherwise by the ticker's owed write (`MARK_OWED_AT_MOST`) or the
one at stop. What a crash, a stop and a quiet spell after events must still find."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.flow.journal import MARK_OWED_AT_MOST
from ntfy_intake.store import audit
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import NtfyEmulator

from .. import harness
from ..harness import (
    DaemonThread,
    audit_records,
    daemon_process,
    env_for,
    event_ids,
    query,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.engines

# A slow pass of the ticker on a loaded 2-core machine, beyond the contract's own bound.
SLACK_S = 1.5


def files_top(state: Path) -> int:
    return max(int(r["seq"]) for r in audit_records(state))


def stored_mark(state: Path) -> int:
    rows = query(state, "SELECT value FROM kv WHERE name = ?", audit.FLUSHED_KEY)
    return int(rows[0][0]) if rows else 0


def status_json(env: dict[str, str]) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    full.update(env)
    done = subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "status", "--json"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_kill9_right_after_a_burst_loses_no_line_and_writes_none_twice(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """A crash while the mark and the trim are still owed (they wait a second now, two when
    no batch comes): the next start must neither write a line twice (the files' own seq
    decides) nor leave `status` counting lines the files hold as unflushed once it stopped."""
    env = env_for(emu.url, tmp_path)
    ids: list[str] = []
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1)
        for i in range(8):
            ids.append(emu.publish("alerts", f"disk full {i}", title="disk full")["id"])
        wait_until(lambda: set(ids) <= set(event_ids(tmp_path)), what="events in the files")
        os.kill(proc.pid, signal.SIGKILL)  # at once: the mark is owed for under a second
        proc.wait(timeout=10)
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1)
        ids.append(emu.publish("alerts", "disk full again", title="disk full")["id"])
        wait_until(lambda: set(ids) <= set(event_ids(tmp_path)), what="the next event")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    seen = event_ids(tmp_path)
    assert sorted(seen) == sorted(set(seen)), "an event line written twice"
    assert set(ids) <= set(seen)
    seqs = [int(r["seq"]) for r in audit_records(tmp_path)]
    assert len(seqs) == len(set(seqs)), "a seq written twice"
    assert stored_mark(tmp_path) == files_top(tmp_path)
    assert status_json(env)["audit"]["unflushed"] == 0


def test_a_stop_right_after_an_event_leaves_nothing_owed(emu: NtfyEmulator, tmp_path: Path) -> None:
    """The stop writes every owed rider (carry_all), however young: the mark at the files'
    last seq, the journal trimmed below it (SQLite), the snapshot `status` reads saying
    stopped, and no line left for `status` to count as unflushed."""
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config) as running:
        emu.wait_for_subscribers(1)
        event = emu.publish("alerts", "disk full", title="disk full")["id"]
        wait_until(lambda: event in event_ids(tmp_path), what="the event's line")
        running.stop()  # at once: what the event left owed is a fraction of a second old
    assert stored_mark(tmp_path) == files_top(tmp_path)
    # DESIGN section 3: a graceful stop leaves an id cursor once any event was recorded.
    assert query(tmp_path, "SELECT kind, value FROM cursor") == [("id", event)]
    env = env_for(emu.url, tmp_path)
    assert status_json(env)["audit"]["unflushed"] == 0
    snapshot = query(tmp_path, "SELECT value FROM kv WHERE name = 'health'")
    assert snapshot and json.loads(snapshot[0][0]).get("state") == "stopped"
    if harness.DATABASE is None:  # PostgreSQL keeps its journal for the other nodes
        mark = stored_mark(tmp_path)
        trimmed = query(tmp_path, "SELECT count(*) FROM audit_journal WHERE seq <= ?", mark)
        assert trimmed == [(0,)]


def test_a_mark_owed_when_events_stop_is_written_within_its_bound(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Events stop with the mark owed under a second: no batch comes to carry it, so the
    ticker's own write must, within MARK_OWED_AT_MOST of the flush (journal.py: what
    `status`'s "audit unflushed" may lag the files by when idle), not at the next pass some
    other due time brings (the cursor settle, the snapshot refresh, the 30 s idle tick)."""
    config = settings_for(emu.url, tmp_path, ntfy_keepalive_interval="45s")
    with DaemonThread(config) as running:
        daemon = running.daemon
        assert daemon is not None
        emu.wait_for_subscribers(1)
        wait_until(lambda: daemon.counters.extra.get("backfills", 0) >= 1, what="start-up poll")
        for i in range(3):
            event = emu.publish("alerts", f"disk full {i}", title="disk full")["id"]
            wait_until(lambda e=event: e in event_ids(tmp_path), timeout=10, what="the line")
            in_files = time.monotonic()
            top = files_top(tmp_path)
            wait_until(
                lambda t=top: stored_mark(tmp_path) >= t,
                timeout=MARK_OWED_AT_MOST + SLACK_S,
                what=f"the mark {top} written after the events stopped",
            )
            lag = time.monotonic() - in_files
            assert lag <= MARK_OWED_AT_MOST + SLACK_S, lag
            time.sleep(0.5)


def test_a_mark_owed_by_a_relay_delivery_is_written_within_its_bound(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """The last line of a burst is often not the event's but the triage delivery's, recorded
    by the relay after the batch (no batch wakes the ticker for it): its mark too must reach
    the store within MARK_OWED_AT_MOST, not at the next snapshot refresh or idle tick."""
    with receiver.running(tmp_path / "rx.sqlite3") as triage:
        config = settings_for(
            emu.url,
            tmp_path / "state",
            ntfy_keepalive_interval="45s",
            relay_url=triage.url,
            cadence_debounce="0s",
        )
        state = tmp_path / "state"
        with DaemonThread(config) as running:
            daemon = running.daemon
            assert daemon is not None
            emu.wait_for_subscribers(1)
            wait_until(lambda: daemon.counters.extra.get("backfills", 0) >= 1, what="start-up")
            emu.publish("alerts", "disk full", title="disk full")
            wait_until(
                lambda: any(r["kind"] == "delivery" for r in audit_records(state)),
                what="the delivery's line",
            )
            in_files = time.monotonic()
            lags = []
            while time.monotonic() - in_files < 12:
                if stored_mark(state) >= files_top(state):
                    break
                time.sleep(0.05)
            lags.append(time.monotonic() - in_files)
            kinds = [(r["seq"], r["kind"]) for r in audit_records(state)]
    assert lags[0] <= MARK_OWED_AT_MOST + SLACK_S, (lags, kinds)


def test_status_and_check_right_after_events_see_them_and_a_running_daemon(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """The snapshot `status` and `check` read now waits up to a second or two to be written:
    right after a burst they must still count every event and see the daemon running."""
    env = env_for(emu.url, tmp_path)
    with daemon_process(env) as proc:
        emu.wait_for_subscribers(1)
        wait_until(
            lambda: query(tmp_path, "SELECT count(*) FROM kv WHERE name = 'health'") == [(1,)],
            what="the first snapshot",
        )
        ids = [emu.publish("alerts", f"disk full {i}", title="disk full")["id"] for i in range(3)]
        wait_until(lambda: set(ids) <= set(event_ids(tmp_path)), what="events in the files")
        found = status_json(env)
        full = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
        full.update(env)
        checked = subprocess.run(
            [sys.executable, "-m", "ntfy_intake", "check"],
            env=full,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert found["inbox"]["events"] == 3
    assert found["daemon"]["running"] is True
    assert checked.returncode == 0, (checked.stdout, checked.stderr)


def test_kill9_with_the_mark_owed_rehydrates_one_request_per_incident(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """Start-up folds the files, then the journal's rows above the stored mark (recovery's
    `_rehydrate_cadence`). Killed while the mark is owed, those rows are in the files as well:
    folded twice, they must still leave one collecting request per incident, which the next
    event of the incident joins (no second request, no second delivery key)."""
    state = tmp_path / "state"
    with receiver.running(tmp_path / "rx.sqlite3") as triage:
        env = env_for(emu.url, state, relay_url=triage.url, cadence_debounce="1h")
        ids: list[str] = []
        with daemon_process(env) as proc:
            emu.wait_for_subscribers(1)
            for i in range(4):
                ids.append(emu.publish("alerts", f"nas down {i}", title="nas down")["id"])
            wait_until(lambda: set(ids) <= set(event_ids(state)), what="events in the files")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        owed = stored_mark(state) < files_top(state)
        with daemon_process(env) as proc:
            emu.wait_for_subscribers(1)
            later = emu.publish("alerts", "nas down again", title="nas down")["id"]
            wait_until(lambda: later in event_ids(state), what="the later event")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
    events = [r for r in audit_records(state) if r["kind"] == "event"]
    outcomes = {r["event_id"]: (r["outcome"], r.get("delivery_key")) for r in events}
    first_key = outcomes[ids[0]][1]
    assert outcomes[ids[0]][0] == "triage_requested"
    assert outcomes[later] == ("joined", first_key), (owed, outcomes)
    assert query(state, "SELECT count(*) FROM outbox") == [(1,)]
    assert Counter(r["event_id"] for r in events) == Counter([*ids, later])
