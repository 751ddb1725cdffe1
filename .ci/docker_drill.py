"""The container kill drill and the compose demo check, run by .ci/docker-check.

    python3 .ci/docker_drill.py kill --image ntfy-intake:check-amd64 [--docker /usr/bin/docker]
    python3 .ci/docker_drill.py compose --image ntfy-intake:check-amd64 --compose "docker-compose"

Standard library only (it drives the docker CLI and publishes over HTTP), so it runs with any
python3 >= 3.11 and never imports the product: what it checks is what the image does.

`kill`: the emulator, the reference receiver and the Signal stand-in run as containers of the
image under test on a private bridge network; the daemon container runs as compose.yaml runs it
(read-only root, /tmp tmpfs, no capabilities, no-new-privileges, state on a named volume, config
mounted read-only). Alerts are published from this host to the emulator's port, published on
127.0.0.1 only. Mid-burst, the daemon container gets `docker kill -s KILL` (three times by
default) and `docker start`. Then: every published id has exactly one audit `event` line in the
volume's log, every delivery key on those lines has a receipt at the receiver (and no receipt
lacks one), the HEALTHCHECK reports healthy, `docker stop` ends with exit 0 within the grace
period, the process is uid 10001 and the volume's files are 0600 in 0700 directories.

`compose`: compose.yaml plus compose.demo.yaml brought up as a throwaway project, alerts
published to the demo's emulator, the daemon's container killed with SIGKILL once mid-burst and
started again; each alert must be recorded exactly once and every triage request delivered.

Every container, network and volume it creates carries the label in --label (docker-check
removes whatever is left by that label) and is removed on the way out, pass or fail.
"""

# This script drives the docker CLI with argv lists it builds itself, and the services it starts
# listen on 0.0.0.0 inside their containers (a private network; only 127.0.0.1 is published).
# ruff: noqa: S603, S104, S108

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import io
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

UID = 10001
STOP_GRACE = 45  # compose.yaml's stop_grace_period
TOPICS = ("alerts", "backups")
TITLES = ("Disk almost full", "Backup stale", "NAS unreachable", "UPS on battery", "Load high")


class Failed(Exception):
    """A check did not hold; the message says which."""


# -- docker ------------------------------------------------------------------------------------


class Docker:
    def __init__(self, client: str, label: str) -> None:
        self.client = client
        self.label = label
        self.containers: list[str] = []
        self.networks: list[str] = []
        self.volumes: list[str] = []

    def run(
        self, *args: str, check: bool = True, timeout: float = 120, input: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        result = subprocess.run(
            [self.client, *args], capture_output=True, timeout=timeout, input=input, check=False
        )
        if check and result.returncode != 0:
            raise Failed(
                f"docker {' '.join(args[:3])} ... exited {result.returncode}: "
                + result.stderr.decode(errors="replace").strip()[-800:]
            )
        return result

    def out(self, *args: str, timeout: float = 120) -> str:
        return self.run(*args, timeout=timeout).stdout.decode().strip()

    def network(self, name: str) -> str:
        self.out("network", "create", "--label", self.label, name)
        self.networks.append(name)
        return name

    def volume(self, name: str) -> str:
        self.out("volume", "create", "--label", self.label, name)
        self.volumes.append(name)
        return name

    def container(self, name: str, *args: str) -> str:
        """`docker run -d` with the label; `args` are run options, the image and its command."""
        self.containers.append(name)
        self.out("run", "-d", "--name", name, "--label", self.label, *args)
        return name

    def state(self, name: str) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(self.out("inspect", "-f", "{{json .State}}", name))
        return state

    def health(self, name: str) -> str:
        health = self.state(name).get("Health") or {}
        return str(health.get("Status", "none"))

    def exec(self, name: str, *argv: str, timeout: float = 60) -> str:
        return self.out("exec", name, *argv, timeout=timeout)

    def files(self, name: str, path: str) -> dict[str, tuple[int, int, bytes]]:
        """`docker cp` out of a (running or stopped) container: path -> (mode, uid, content)."""
        raw = self.run("cp", f"{name}:{path}", "-", timeout=120).stdout
        found: dict[str, tuple[int, int, bytes]] = {}
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            for member in tar.getmembers():
                data = b""
                if member.isfile():
                    handle = tar.extractfile(member)
                    data = handle.read() if handle else b""
                kind = 0o040000 if member.isdir() else 0o100000 if member.isfile() else 0
                found[member.name] = (kind | member.mode, member.uid, data)
        return found

    def logs(self, name: str, lines: int = 40) -> str:
        result = self.run("logs", "--tail", str(lines), name, check=False)
        return (result.stdout + result.stderr).decode(errors="replace")

    def cleanup(self) -> None:
        for name in reversed(self.containers):
            self.run("rm", "-f", "-v", name, check=False)
        for name in self.networks:
            self.run("network", "rm", name, check=False)
        for name in self.volumes:
            self.run("volume", "rm", "-f", name, check=False)


# -- publishing --------------------------------------------------------------------------------


class Publisher:
    """Publishes to the emulator over HTTP from this host; remembers every id the server gave."""

    def __init__(self, host: str, port: int, seed: int, topics: Sequence[str] = TOPICS) -> None:
        self.host, self.port, self.topics = host, port, tuple(topics)
        self.rng = random.Random(seed)
        self.ids: list[str] = []
        self.errors = 0
        self.lock = threading.Lock()
        self.n = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            self._local.conn = conn
        return conn

    def publish_one(self) -> None:
        with self.lock:
            self.n += 1
            n = self.n
        topic = self.rng.choice(self.topics)
        if self.rng.random() < 0.25:
            title, priority = f"container drill incident {n}", self.rng.randint(1, 5)
        else:
            title, priority = self.rng.choice(TITLES), self.rng.choice((2, 3, 3, 4, 5))
        body = f"{title} (#{n})".encode()
        for _ in range(3):
            conn = self._conn()
            try:
                conn.request(
                    "POST",
                    f"/{topic}",
                    body=body,
                    headers={"Title": title, "Priority": str(priority)},
                )
                response = conn.getresponse()
                payload = response.read()
                if response.status == 200:
                    with self.lock:
                        self.ids.append(json.loads(payload)["id"])
                    return
            except (OSError, http.client.HTTPException, ValueError):
                conn.close()
                self._local.conn = None
            time.sleep(0.2)
        with self.lock:
            self.errors += 1

    def burst(self, count: int, on: int, action: Callable[[], None]) -> None:
        """Publish `count` back to back; run `action` (the kill) once `on` of them are out."""
        for i in range(count):
            if i == on:
                action()
            self.publish_one()

    def start_steady(self, interval: float) -> None:
        def loop() -> None:
            while not self._stop.wait(interval):
                self.publish_one()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def published(self) -> list[str]:
        with self.lock:
            return list(self.ids)


# -- reading the daemon's state ----------------------------------------------------------------


def audit_records(docker: Docker, container: str) -> list[dict[str, Any]]:
    """Every record of the audit log in the container's /data/audit (torn last line skipped)."""
    records: list[dict[str, Any]] = []
    for name, (mode, _, data) in sorted(docker.files(container, "/data/audit").items()):
        if not (mode & 0o100000 and name.endswith(".jsonl")):
            continue
        for line in data.decode().splitlines():
            with contextlib.suppress(ValueError):  # a torn last line
                records.append(json.loads(line))
    return records


def event_counts(records: Sequence[dict[str, Any]]) -> Counter[str]:
    return Counter(r["event_id"] for r in records if r.get("kind") == "event")


def delivery_keys(records: Sequence[dict[str, Any]]) -> set[str]:
    return {
        r["delivery_key"] for r in records if r.get("kind") == "event" and r.get("delivery_key")
    }


RECEIPTS = (
    "import json, sqlite3; c = sqlite3.connect('file:/data/receiver.sqlite3?mode=ro', uri=True); "
    "print(json.dumps(c.execute('SELECT delivery_key, repeats FROM receipts').fetchall()))"
)


def receipts(docker: Docker, receiver: str) -> dict[str, int]:
    try:
        rows = json.loads(docker.exec(receiver, "python", "-c", RECEIPTS, timeout=120))
    except Failed as exc:
        if "no such table" in str(exc) or "unable to open" in str(exc):
            return {}
        raise
    return {key: repeats for key, repeats in rows}


def wait_for(what: str, predicate: Callable[[], bool], timeout: float, every: float = 0.5) -> float:
    """Poll until `predicate()`; returns the seconds it took, raises Failed after `timeout`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise Failed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - start


def wait_healthy(docker: Docker, container: str, timeout: float) -> float:
    def healthy() -> bool:
        status = docker.health(container)
        if status == "unhealthy":
            log = (docker.state(container).get("Health") or {}).get("Log") or [{}]
            raise Failed(f"{container} turned unhealthy: {log[-1].get('Output', '').strip()}")
        return status == "healthy"

    return wait_for(f"{container} to turn healthy", healthy, timeout, every=0.25)


def published_port(docker: Docker, container: str, port: int) -> int:
    # "127.0.0.1:49153" (one line per address family)
    line = docker.out("port", container, f"{port}/tcp").splitlines()[0]
    host, _, number = line.rpartition(":")
    if host not in ("127.0.0.1",):
        raise Failed(f"{container}:{port} is published on {host}, not only on 127.0.0.1")
    return int(number)


def free_port() -> int:
    """A free port above the kernel's ephemeral range: .ci/run runs this check beside the test
    suite, whose servers bind port 0 and could take a port-0 pick before compose publishes it."""
    try:
        high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        high = 60999
    first, last = (high + 1, 65535) if high < 64000 else (10000, 20000)
    while True:
        port = random.randint(first, last)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def wait_http(port: int, timeout: float) -> None:
    def answers() -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v1/health")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except (OSError, http.client.HTTPException):
            return False

    wait_for(f"the emulator on 127.0.0.1:{port}", answers, timeout, every=0.25)


# -- the verdict -------------------------------------------------------------------------------


class Verdict:
    def __init__(self, title: str) -> None:
        self.title = title
        self.rows: list[tuple[str, str]] = []
        self.failures: list[str] = []

    def row(self, name: str, value: object, ok: bool = True) -> None:
        self.rows.append((name, str(value)))
        if not ok:
            self.failures.append(f"{name}: {value}")

    def print(self) -> None:
        print(self.title)
        for name, value in self.rows:
            print(f"  {name:<56} {value}")
        verdict = "PASS" if not self.failures else "FAIL (" + "; ".join(self.failures) + ")"
        print(f"  {'verdict':<56} {verdict}", flush=True)


def check_records(
    verdict: Verdict, ids: Sequence[str], records: Sequence[dict[str, Any]]
) -> set[str]:
    counts = event_counts(records)
    lost = [i for i in ids if counts[i] == 0]
    doubled = [i for i in ids if counts[i] > 1]
    verdict.row("lost (published, no event line)", len(lost), not lost)
    verdict.row("double outcomes (more than one event line)", len(doubled), not doubled)
    keys = delivery_keys(records)
    delivered = Counter(
        r["delivery_key"]
        for r in records
        if r.get("kind") == "delivery" and r.get("result") == "delivered"
    )
    not_once = sorted(k for k in keys if delivered[k] != 1)
    verdict.row("triage requests audited as delivered != once", len(not_once), not not_once)
    if lost or doubled:
        print(f"  lost: {lost[:10]} doubled: {doubled[:10]}", file=sys.stderr)
    return keys


def check_receipts(verdict: Verdict, keys: set[str], got: dict[str, int]) -> None:
    missing = sorted(keys - set(got))
    unknown = sorted(set(got) - keys)
    verdict.row(
        "triage requests / receipts at the receiver",
        f"{len(keys)} / {len(got)}",
        not missing and not unknown,
    )
    verdict.row("redeliveries absorbed (receiver repeats)", sum(got.values()))


def check_state_files(verdict: Verdict, files: dict[str, tuple[int, int, bytes]]) -> None:
    """Files 0600 and directories 0700, all owned by uid 10001 (the tar of `docker cp`)."""
    bad = []
    for name, (mode, uid, _) in sorted(files.items()):
        want = 0o700 if mode & 0o040000 else 0o600
        if (mode & 0o7777) != want or uid != UID:
            bad.append(f"{name} {mode & 0o7777:04o} uid {uid}")
    dirs = sum(1 for m, _, _ in files.values() if m & 0o040000)
    verdict.row(
        "state files 0600 / dirs 0700, uid 10001",
        f"{len(files) - dirs} files, {dirs} dirs" + (f"; wrong: {bad[:5]}" if bad else ": ok"),
        not bad,
    )


def check_uid(verdict: Verdict, docker: Docker, container: str) -> None:
    status = docker.exec(container, "cat", "/proc/1/status")
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    gids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Gid:"))
    caps = next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:"))
    ok = set(uids) == {str(UID)} and set(gids) == {str(UID)} and int(caps, 16) == 0
    verdict.row("PID 1 uid / gid / effective capabilities", f"{uids[0]} / {gids[0]} / {caps}", ok)


def check_stop(
    verdict: Verdict, docker: Docker, stop: Callable[[], object], container: str
) -> None:
    started = time.monotonic()
    stop()
    took = time.monotonic() - started
    code = docker.state(container).get("ExitCode")
    ok = code == 0 and took < STOP_GRACE
    verdict.row(f"docker stop (grace {STOP_GRACE} s): exit code, time", f"{code}, {took:.1f} s", ok)


# -- kill ---------------------------------------------------------------------------------------


def kill_drill(args: argparse.Namespace) -> int:
    docker = Docker(args.docker, args.label)
    run_id = secrets.token_hex(3)
    prefix = f"ntfy-intake-check-{run_id}"
    verdict = Verdict(f"container kill drill: {args.image} ({args.kills} kills, seed {args.seed})")
    slow = args.slow
    started_at = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ntfy-intake-kill-"))
    try:
        # The relay secret, as compose would mount a secret: readable by uid 10001 only.
        secret = work / "relay_secret"
        secret.write_text("whsec_" + base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
        os.chown(secret, UID, UID)
        secret.chmod(0o400)
        config = work / "config.toml"
        config.write_text(CONFIG)
        config.chmod(0o644)
        net = docker.network(prefix)
        volume = docker.volume(f"{prefix}-data")
        hardened = ["--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL"]
        hardened += ["--security-opt", "no-new-privileges:true", "--network", net]
        secret_mount = ["-v", f"{secret}:/run/secrets/relay_secret:ro"]
        emulator = docker.container(
            f"{prefix}-ntfy",
            *hardened,
            "--network-alias",
            "ntfy",
            "-p",
            "127.0.0.1::8786",
            args.image,
            "emulator",
            "--host",
            "0.0.0.0",
            "--port",
            "8786",
            "--keepalive",
            "5s",
            "--no-rate-limits",
        )
        receiver = docker.container(
            f"{prefix}-triage",
            *hardened,
            "--network-alias",
            "triage",
            *secret_mount,
            args.image,
            "receiver",
            "--host",
            "0.0.0.0",
            "--port",
            "8790",
            "--db",
            "/data/receiver.sqlite3",
            "--secret-file",
            "/run/secrets/relay_secret",
        )
        docker.container(
            f"{prefix}-signal",
            *hardened,
            "--network-alias",
            "signal",
            args.image,
            "signal-standin",
            "--host",
            "0.0.0.0",
            "--port",
            "8791",
        )
        port = published_port(docker, emulator, 8786)
        wait_http(port, 60 * slow)
        # The daemon as compose.yaml runs it. Only the health *interval* is shortened (the same
        # `ntfy-intake check` command): the image's 30 s would make every wait here 30 s long.
        daemon = docker.container(
            f"{prefix}-daemon",
            *hardened,
            *secret_mount,
            "-v",
            f"{volume}:/data",
            "-v",
            f"{config}:/etc/ntfy-intake/config.toml:ro",
            "--health-interval",
            args.health_interval,
            "--health-start-period",
            "120s",
            args.image,
        )
        healthy_s = [wait_healthy(docker, daemon, 120 * slow)]
        publisher = Publisher("127.0.0.1", port, args.seed)
        publisher.start_steady(args.interval)

        def caught_up(ids: Sequence[str]) -> Callable[[], bool]:
            def done() -> bool:
                counts = event_counts(audit_records(docker, daemon))
                return all(counts[i] for i in ids)

            return done

        rng = random.Random(args.seed)
        recovery: list[float] = []
        for kill in range(1, args.kills + 1):
            time.sleep(rng.uniform(1.0, 2.5))
            killed = threading.Event()

            def kill_now(killed: threading.Event = killed) -> None:
                docker.out("kill", "-s", "KILL", daemon)
                killed.set()

            size = rng.randint(30, 50)
            publisher.burst(size, rng.randint(5, size - 5), kill_now)
            if not killed.is_set():
                raise Failed("the burst ended before the kill")
            state = docker.state(daemon)
            if state["Running"] or state["ExitCode"] != 137:
                raise Failed(f"kill {kill}: the daemon container is not dead by SIGKILL: {state}")
            time.sleep(rng.uniform(0.3, 1.0))  # down while the steady stream goes on
            before = publisher.published()
            restart = time.monotonic()
            docker.out("start", daemon)
            wait_for(f"restart {kill} to catch up", caught_up(before), 60 * slow, every=0.3)
            recovery.append(time.monotonic() - restart)
            healthy_s.append(wait_healthy(docker, daemon, 120 * slow) + recovery[-1])
            print(
                f"kill drill: kill {kill}/{args.kills} ok, caught up in {recovery[-1]:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(1.0)
        publisher.stop()
        ids = publisher.published()
        stopped = time.monotonic()
        wait_for("every published id to be recorded", caught_up(ids), 60 * slow)
        keys_now = delivery_keys(audit_records(docker, daemon))
        wait_for(
            "every triage request to reach the receiver",
            lambda: keys_now <= set(receipts(docker, receiver)),
            90 * slow,
            every=1.0,
        )
        settled = time.monotonic() - stopped
        verdict.row(
            "events published",
            f"{len(ids)} ({publisher.errors} publish errors)",
            publisher.errors == 0,
        )
        verdict.row("docker kill -s KILL mid-burst, docker start", args.kills)
        verdict.row(
            "HEALTHCHECK: first start to healthy",
            f"{healthy_s[0]:.1f} s (interval {args.health_interval})",
        )
        verdict.row("restart to healthy max", f"{max(healthy_s[1:], default=0):.1f} s")
        verdict.row(
            "restart to caught up max / median",
            f"{max(recovery):.1f} s / {sorted(recovery)[len(recovery) // 2]:.1f} s",
        )
        verdict.row("after publishing stopped: all recorded and receipted", f"{settled:.1f} s")
        check_uid(verdict, docker, daemon)
        check_stop(
            verdict,
            docker,
            lambda: docker.out("stop", "-t", str(STOP_GRACE), daemon, timeout=90),
            daemon,
        )
        # Read from the volume after the stop: what a backup of it would hold.
        records = audit_records(docker, daemon)
        keys = check_records(verdict, ids, records)
        check_receipts(verdict, keys, receipts(docker, receiver))
        check_state_files(verdict, docker.files(daemon, "/data"))
        verdict.row("wall time", f"{time.monotonic() - started_at:.1f} s")
    except Failed as exc:
        verdict.row("error", exc, ok=False)
        for name in docker.containers:
            print(f"--- docker logs {name} (last lines)\n{docker.logs(name)}", file=sys.stderr)
    finally:
        docker.cleanup()
        for path in work.iterdir():
            path.unlink()
        work.rmdir()
    verdict.print()
    return 0 if not verdict.failures else 1


CONFIG = """\
# The container kill drill's daemon (written by .ci/docker_drill.py).
[ntfy]
url = "http://ntfy:8786"
topics = ["alerts", "backups"]
keepalive_interval = "5s"
reorder_window = "500ms"

[relay]
url = "http://triage:8790/triage"
secret_file = "/run/secrets/relay_secret"
timeout = "5s"

[cadence]
debounce = "1s"

[owner]
signal_url = "http://signal:8791"
signal_number = "+15550000001"
recipients = ["+15550000002"]
"""


# -- compose ------------------------------------------------------------------------------------


def compose_check(args: argparse.Namespace) -> int:
    docker = Docker(args.docker, args.label)
    project = args.project or f"ntfy-intake-check-{secrets.token_hex(3)}"
    compose = [
        *args.compose.split(),
        "-p",
        project,
        "-f",
        "compose.yaml",
        "-f",
        "compose.demo.yaml",
    ]
    verdict = Verdict(
        f"compose demo: {args.compose} -f compose.yaml -f compose.demo.yaml ({args.image})"
    )
    port = free_port()
    env = {
        **os.environ,
        "NTFY_INTAKE_IMAGE": args.image,
        # compose.yaml publishes ntfy on the LAN; the check keeps it on this host's loopback.
        "NTFY_PUBLISH": f"127.0.0.1:{port}",
    }

    def run_compose(*more: str, timeout: float = 300) -> str:
        result = subprocess.run(
            [*compose, *more],
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
            cwd=args.repo,
        )
        if result.returncode != 0:
            raise Failed(
                f"{' '.join(more[:2])}: exit {result.returncode}: "
                + result.stderr.decode(errors="replace").strip()[-1200:]
            )
        return result.stdout.decode().strip()

    started_at = time.monotonic()
    try:
        up = time.monotonic()
        run_compose("up", "-d", "--no-build")
        daemon = run_compose("ps", "-q", "ntfy-intake")
        receiver = run_compose("ps", "-q", "triage")
        signal = run_compose("ps", "-q", "signal-cli-rest-api")
        for name in (daemon, receiver, signal):
            if not name:
                raise Failed("a demo service did not start")
        healthy = wait_healthy(docker, daemon, 120 * args.slow)
        verdict.row(
            "up -d to ntfy-intake healthy",
            f"{time.monotonic() - up:.1f} s ({healthy:.1f} s waiting)",
        )
        wait_http(port, 30 * args.slow)
        # deploy/compose.config.toml subscribes to "alerts" only.
        publisher = Publisher("127.0.0.1", port, args.seed, topics=("alerts",))
        killed = threading.Event()

        def kill_now() -> None:
            docker.out("kill", "-s", "KILL", daemon)
            killed.set()

        publisher.burst(40, 20, kill_now)
        state = docker.state(daemon)
        verdict.row(
            "daemon container after docker kill -s KILL",
            f"exit {state['ExitCode']}",
            not state["Running"] and state["ExitCode"] == 137,
        )
        for _ in range(10):
            publisher.publish_one()  # while it is down
        run_compose("start", "ntfy-intake")
        ids = publisher.published()
        wait_for(
            "every alert to be recorded",
            lambda: all(event_counts(audit_records(docker, daemon))[i] for i in ids),
            60 * args.slow,
        )
        keys_now = delivery_keys(audit_records(docker, daemon))
        wait_for(
            "every triage request to reach the demo receiver",
            lambda: keys_now <= set(receipts(docker, receiver)),
            90 * args.slow,
            every=1.0,
        )
        verdict.row(
            "alerts published",
            f"{len(ids)} ({publisher.errors} publish errors)",
            publisher.errors == 0,
        )
        wait_healthy(docker, daemon, 120 * args.slow)
        verdict.row("ntfy-intake healthy again after the kill", "yes")

        # The owner path: the receiver's replies go through the cadence to the Signal stand-in.
        # At least once (Signal has no idempotency key), so a kill mid-send may add a repeat.
        def owner_counts() -> tuple[int, int]:
            records = audit_records(docker, daemon)
            queued = sum(
                1
                for r in records
                if r.get("kind") == "owner_message" and r.get("result") == "queued"
            )
            return queued, int(docker.exec(signal, "python", "-c", SIGNAL_MESSAGES))

        wait_for(
            "owner messages to reach the Signal stand-in",
            lambda: owner_counts()[1] >= owner_counts()[0],
            30 * args.slow,
            every=1.0,
        )
        queued, sent = owner_counts()
        verdict.row(
            "owner messages queued / received by the Signal stand-in",
            f"{queued} / {sent}",
            sent >= queued,
        )
        restarts = docker.out("inspect", "-f", "{{.RestartCount}}", daemon)
        verdict.row("restarts by the restart policy after the kill", restarts)
        check_uid(verdict, docker, daemon)
        check_stop(
            verdict,
            docker,
            lambda: run_compose("stop", "-t", str(STOP_GRACE), "ntfy-intake"),
            daemon,
        )
        records = audit_records(docker, daemon)
        keys = check_records(verdict, ids, records)
        check_receipts(verdict, keys, receipts(docker, receiver))
        check_state_files(verdict, docker.files(daemon, "/data"))
        verdict.row("wall time", f"{time.monotonic() - started_at:.1f} s")
    except Failed as exc:
        verdict.row("error", exc, ok=False)
        logs = subprocess.run(
            [*compose, "logs", "--tail", "30"],
            capture_output=True,
            env=env,
            cwd=args.repo,
            check=False,
        )
        print(logs.stdout.decode(errors="replace")[-6000:], file=sys.stderr)
    finally:
        subprocess.run(
            [*compose, "down", "-v", "-t", "10"],
            capture_output=True,
            env=env,
            cwd=args.repo,
            check=False,
            timeout=120,
        )
    verdict.print()
    return 0 if not verdict.failures else 1


SIGNAL_MESSAGES = (
    "import json, urllib.request; "
    "print(len(json.load(urllib.request.urlopen('http://127.0.0.1:8080/_standin/messages'))))"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("kill", "compose"))
    parser.add_argument("--image", required=True)
    parser.add_argument("--docker", default="docker", help="the docker client")
    parser.add_argument("--compose", default="docker compose", help="the compose command")
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--label", default="org.ntfy-intake.check=1")
    parser.add_argument("--project", default="", help="compose project name (default: random)")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--interval", type=float, default=0.05, help="steady publish interval")
    parser.add_argument("--health-interval", default="2s")
    parser.add_argument("--slow", type=float, default=1.0, help="scale every timeout (emulation)")
    args = parser.parse_args(argv)
    return kill_drill(args) if args.what == "kill" else compose_check(args)


if __name__ == "__main__":
    sys.exit(main())
