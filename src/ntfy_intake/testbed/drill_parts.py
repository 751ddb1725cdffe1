"""The drill's parts: what was published (the ledger and the publisher), what was recorded
(the audit tail, the cursor), and the processes and servers it drives (the daemon, the receiver).
The schedule is drill_plan.py, the run drill.py, the verdict drill_report.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from ntfy_intake.store import audit
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.drill_store import StoreView
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

CRASH_POINTS = ("after_inbox_commit", "after_audit_write", "after_post")
CRASH_ENV = "NTFY_INTAKE_TEST_CRASH_AT"
EMULATOR_TOPICS = ("alerts", "backups")

# Daemon timing for the emulator (its keepalive is 1 s). The silence lasts a little longer than
# the keepalive timeout, so the watchdog must drop the zombie stream and reconnect.
KEEPALIVE_INTERVAL = 1.0
KEEPALIVE_TIMEOUT = 1.5
SILENCE_S = KEEPALIVE_TIMEOUT + 0.3
REORDER_WINDOW = "300ms"
DEBOUNCE = "300ms"


def drill_emulator(*, delayed_sender: bool = True) -> NtfyEmulator:
    """The drills' emulator: the daemon reconnects after every fault (a restart, a failover to
    another process), so ntfy's request and subscription limits, which would throttle the
    reconnects, are off. `delayed_sender=False`: scheduled messages are the drill's to deliver."""
    config = EmulatorConfig(
        keepalive_interval=KEEPALIVE_INTERVAL,
        manager_interval=None,
        request_limit=False,
        subscription_limit=None,
    )
    if not delayed_sender:
        config = dataclasses.replace(config, delayed_sender_interval=None)
    return NtfyEmulator(config)


RELAY_TIMEOUT = "2s"
RELAY_MAX_ATTEMPTS = "100"  # an outage must never turn a row dead during a drill

POLL_S = 0.01
STALL_BOUND_S = 30.0  # a restart that has not caught up by then is a stall (FAIL)
CRASH_BOUND_S = 15.0  # how long a crash point may take to be reached
STOP_BOUND_S = 20.0  # SIGTERM to exit
FINAL_BOUND_S = 60.0  # catch-up after publishing stopped
RELAY_BOUND_S = 90.0  # every triage request receipted (the relay backs off from 2 s upward)
EVICT_AGE_S = 3.0  # only ids published this long ago (and already recorded) are evicted
SCHEDULE_DELAY_S = 0.5  # a scheduled message falls due this soon; delivered at the next start
CACHE_LAG_S = 1.0  # cache writes lag the live publish by this much around one restart

ALERT_TITLES = (
    "disk full on nas",
    "backup stale: photos",
    "gatus: jellyfin down",
    "cpu temperature high",
    "zfs scrub found errors",
    "certificate expires soon",
    "ups on battery",
    "smart warning on sda",
)


# -- what was published ---------------------------------------------------------------------------


class Ledger:
    """Every id the drill published, in publish order, with when (monotonic) and where."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: list[str] = []
        self._at: list[float] = []
        self.by_topic: Counter[str] = Counter()
        self.errors = 0

    def add(self, event_id: str, topic: str) -> None:
        with self._lock:
            self._ids.append(event_id)
            self._at.append(time.monotonic())
            self.by_topic[topic] += 1

    def error(self) -> None:
        with self._lock:
            self.errors += 1

    def count(self) -> int:
        with self._lock:
            return len(self._ids)

    def ids(self, n: int | None = None) -> list[str]:
        with self._lock:
            return list(self._ids if n is None else self._ids[:n])

    def published_before(self, cutoff: float) -> list[str]:
        with self._lock:
            return [i for i, at in zip(self._ids, self._at, strict=True) if at < cutoff]


Send = Callable[[str, str, str, int], str]  # (topic, title, message, priority) -> event id


@dataclass(frozen=True)
class Pace:
    interval: tuple[float, float]  # seconds between steady messages
    burst: tuple[int, int]  # messages per burst
    burst_every: tuple[float, float]  # seconds between bursts


EMULATOR_PACE = Pace((0.02, 0.05), (10, 40), (1.0, 3.0))
# A real server rate-limits visitors (ntfy: burst 60, then one request per 5 s) unless the
# publishing host is exempt; see docs/drill.md.
SERVER_PACE = Pace((0.2, 0.5), (3, 8), (5.0, 10.0))


def make_alert(rng: random.Random, n: int, topics: Sequence[str]) -> tuple[str, str, str, int]:
    """A mix that exercises the cadence: new incidents (triage requests), repeats of a few known
    ones (suppressed, joined or escalated) and JSON envelopes that fire and resolve."""
    topic = rng.choice(topics)
    roll = rng.random()
    if roll < 0.25:
        return topic, f"drill incident {n}", f"unique incident #{n}", rng.randint(1, 5)
    if roll < 0.85:
        title = rng.choice(ALERT_TITLES)
        return topic, title, f"{title} (#{n})", rng.choice((2, 3, 3, 3, 4, 5))
    envelope = {
        "incident": f"drill-svc-{rng.randint(1, 4)}",
        "severity": rng.randint(1, 5),
        "status": rng.choice(("firing", "firing", "resolved")),
        "n": n,
    }
    return topic, "", json.dumps(envelope), 3


class Publisher:
    """A steady stream plus bursts, from a background thread, until stopped."""

    def __init__(
        self, send: Send, topics: Sequence[str], rng: random.Random, ledger: Ledger, pace: Pace
    ) -> None:
        self.send = send
        self.topics = tuple(topics)
        self.rng = rng
        self.ledger = ledger
        self.pace = pace
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drill-publisher", daemon=True)
        self._n = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        rng, pace = self.rng, self.pace
        next_burst = time.monotonic() + rng.uniform(*pace.burst_every)
        while not self._stop.is_set():
            if time.monotonic() >= next_burst:
                for _ in range(rng.randint(*pace.burst)):
                    self._one()
                next_burst = time.monotonic() + rng.uniform(*pace.burst_every)
            self._one()
            self._stop.wait(rng.uniform(*pace.interval))

    def _one(self) -> None:
        if self._stop.is_set():
            return
        self._n += 1
        topic, title, message, priority = make_alert(self.rng, self._n, self.topics)
        try:
            event_id = self.send(topic, title, message, priority)
        except Exception:  # noqa: BLE001 - counted and shown; the drill goes on
            self.ledger.error()
            return
        self.ledger.add(event_id, topic)


def emulator_sender(emu: NtfyEmulator) -> Send:
    def send(topic: str, title: str, message: str, priority: int) -> str:
        return str(emu.publish(topic, message, title=title, priority=priority)["id"])

    return send


def server_sender(client: httpx.Client, url: str, token: str | None, stop: threading.Event) -> Send:
    """Publish over HTTP to a real server; 429 waits (Retry-After or 5 s) and tries again."""

    def send(topic: str, title: str, message: str, priority: int) -> str:
        headers = {"Priority": str(priority)}
        if title:
            headers["Title"] = title
        if token:
            headers["Authorization"] = f"Bearer {token}"
        for _ in range(6):
            response = client.post(f"{url}/{topic}", content=message.encode(), headers=headers)
            if response.status_code == 429:
                retry = response.headers.get("Retry-After", "")
                stop.wait(float(retry) if retry.isdigit() else 5.0)
                continue
            response.raise_for_status()
            return str(response.json()["id"])
        raise RuntimeError("rate limited: exempt the publishing host on the server")

    return send


# -- what was recorded -----------------------------------------------------------------------------


class AuditTail:
    """Follows the audit log as it grows: outcome lines per event id, triage delivery keys.

    Only complete lines are consumed, so a torn tail (which the daemon truncates on restart) is
    never counted; the offset always sits on a line boundary the truncation cannot cross.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.counts: Counter[str] = Counter()
        self.keys: set[str] = set()
        self._offsets: dict[Path, int] = {}

    def poll(self) -> int:
        """Read what was appended since the last poll; returns the number of new event lines."""
        added = 0
        for path in audit.log_files(self.directory):
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            for raw in data[:end].split(b"\n"):
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("kind") == "event":
                    self.counts[str(record.get("event_id"))] += 1
                    added += 1
                    if record.get("delivery_key"):
                        self.keys.add(str(record["delivery_key"]))
            self._offsets[path] = offset + end + 1
        return added


def read_cursor(store: StoreView) -> tuple[str, str] | None:
    row = store.row("SELECT kind, value FROM cursor WHERE id = 1")
    return None if row is None else (str(row[0]), str(row[1]))


def health_pid(store: StoreView) -> int | None:
    """The pid in the daemon's health row: its event loop (and SIGTERM handler) is running."""
    row = store.row("SELECT value FROM kv WHERE name = 'health'")
    try:
        pid = json.loads(str(row[0]))["pid"] if row else None
    except (ValueError, KeyError, TypeError):
        return None
    return pid if isinstance(pid, int) else None


# -- the processes and servers the drill drives ----------------------------------------------------


class DaemonProcess:
    """`python -m ntfy_intake run` as a subprocess; every exit path kills it by pid."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
        self.env = {**base, **env}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._log: IO[bytes] | None = None

    def start(self, crash_at: str | None = None) -> float:
        assert not self.alive(), "a daemon is already running"
        self.starts += 1
        env = dict(self.env)
        if crash_at:
            env[CRASH_ENV] = crash_at
        if self._log is None:
            self._log = self.log_path.open("ab")
        banner = f"--- drill: start #{self.starts} crash_at={crash_at or '-'} ---\n"
        self._log.write(banner.encode())
        self._log.flush()
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ntfy_intake", "run"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return started

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill9(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None if it is still running after `timeout`."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, timeout: float) -> int | None:
        """SIGTERM and wait; None (and a kill -9) if it did not exit in time."""
        if self.proc is None or self.proc.poll() is not None:
            return self.returncode()
        os.kill(self.proc.pid, signal.SIGTERM)
        code = self.wait_exit(timeout)
        if code is None:
            self.kill9()
        return code

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.kill9()
        if self._log is not None:
            self._log.close()
            self._log = None


class ReceiverServer:
    """The reference triage receiver in a thread, stoppable and restartable on the same port."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.faults = receiver.ReceiverFaults()
        self.port = 0
        self.url = ""
        self._stack: contextlib.ExitStack | None = None

    def start(self) -> None:
        app = receiver.create_app(self.db_path, faults=self.faults)
        stack = contextlib.ExitStack()
        base = stack.enter_context(
            _serve.serving(app, port=self.port, on_stop=app.state.stopping.set)
        )
        self._stack = stack
        self.port = int(base.rsplit(":", 1)[1])
        self.url = f"{base}/triage"

    def stop(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()
