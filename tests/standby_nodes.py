"""The pieces of a standby test (tests/standby.py puts them together): one node's process, the
receiver that knows which node sent each POST, the publisher, the emulator's open streams.

- `Node`: one `ntfy-intake run` process of a node (its own state dir, its own node name, a fixed
  HTTP port), with its stdout (the JSON log) and stderr kept in files; started, signalled and
  killed by pid, and asked for its `status --json`, /healthz and feed over HTTP;
- `TaggedReceiver`: the reference receiver (testbed/receiver.py) behind a wrapper that records
  which node sent each POST (every node gets its own path, `/<node>/triage`) and when it started
  and ended, on the test's monotonic clock, so a repeat can be held to the POST that was in
  flight at a fault;
- `Stream`: a steady stream of messages; `Subscribers`: the emulator's open streams over time.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import ntfy_intake
from ntfy_intake.store import audit
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import NtfyEmulator

from . import ports

TOKEN = "standby-feed-token-7Hq2Xv9Lp4"
# The source of the package under test: the daemons run the same code as the test.
SRC = Path(ntfy_intake.__file__).resolve().parents[1]


free_port = ports.free_port


# -- the receiver ----------------------------------------------------------------------------------


@dataclass
class Post:
    node: str
    key: str
    started: float  # monotonic, this process
    ended: float | None = None
    status: int | None = None


class TaggedReceiver:
    """The reference receiver (testbed/receiver.py), each POST recorded with its node (module doc)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.faults = receiver.ReceiverFaults()
        self.app = receiver.create_app(db_path, faults=self.faults)
        self.posts: list[Post] = []
        self.base = ""
        self._lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        parts = path.split("/")
        if len(parts) != 3 or parts[2] != "triage":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        post = Post(parts[1], headers.get(b"idempotency-key", b"").decode(), time.monotonic())
        with self._lock:
            self.posts.append(post)

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                post.status = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                post.ended = time.monotonic()

        await self.app({**scope, "path": "/triage", "raw_path": b"/triage"}, receive, sending)

    def url_for(self, node: str) -> str:
        return f"{self.base}/{node}/triage"

    def snapshot(self) -> list[Post]:
        with self._lock:
            return list(self.posts)

    def in_flight(self, node: str) -> list[Post]:
        return [p for p in self.snapshot() if p.node == node and p.ended is None]

    @contextlib.contextmanager
    def running(self) -> Iterator[TaggedReceiver]:
        with _serve.serving(self, on_stop=self.app.state.stopping.set) as base:
            self.base = base
            yield self


# -- the publisher ---------------------------------------------------------------------------------


class Stream:
    """Publishes one message every 20-40 ms on alternating topics until stopped; each its own
    incident (so each is one triage request) unless `incidents` cycles through that many."""

    def __init__(self, emu: NtfyEmulator, *, incidents: int | None = None, seed: int = 24) -> None:
        self.emu = emu
        self.incidents = incidents
        self.rng = random.Random(seed)
        self.ids: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            title = f"steady {n if self.incidents is None else n % self.incidents}"
            event = self.emu.publish("alerts" if n % 2 else "backups", f"#{n}", title=title)
            with self._lock:
                self.ids.append(event["id"])
            self._stop.wait(self.rng.uniform(0.02, 0.04))

    def start(self) -> Stream:
        self._thread.start()
        return self

    def stop(self) -> list[str]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        return self.snapshot()

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.ids)


class Subscribers:
    """The emulator's count of open streams, sampled every 20 ms from `start` to `stop`: when
    it changed, on the test's monotonic clock."""

    def __init__(self, emu: NtfyEmulator) -> None:
        self.emu = emu
        self.changes: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="subscribers", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            count = self.emu.subscriber_count()
            if not self.changes or self.changes[-1][1] != count:
                self.changes.append((time.monotonic(), count))
            self._stop.wait(0.02)

    def start(self) -> Subscribers:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def first(self, count: int, after: float) -> float | None:
        """When the count was first `count` after `after` (None: never)."""
        return next((t for t, n in self.changes if t >= after and n == count), None)


# -- one node --------------------------------------------------------------------------------------


class Node:
    """One `ntfy-intake run` process of a node (module doc); every start appends to its logs."""

    def __init__(self, name: str, state_dir: Path, env: dict[str, str], port: int) -> None:
        self.name = name
        self.state_dir = state_dir
        self.env = env
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir.parent / f"{name}.log"
        self.err_path = state_dir.parent / f"{name}.stderr"
        self.starts = 0

    def start(self, **extra_env: str) -> Node:
        assert not self.alive, f"{self.name} runs already"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
        env.update(self.env)
        env.update(extra_env)
        with self.log_path.open("ab") as out, self.err_path.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ntfy_intake", "run"], env=env, stdout=out, stderr=err
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: signal.Signals) -> float:
        """Send `sig` by pid; the instant it was sent (monotonic)."""
        os.kill(self.pid, sig)
        return time.monotonic()

    def kill9(self) -> float:
        at = self.send(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)
        return at

    def terminate(self, timeout: float = 30.0) -> tuple[float, int]:
        """SIGTERM, then the exit code (the instant it was sent, the code)."""
        at = self.send(signal.SIGTERM)
        assert self.proc is not None
        return at, self.proc.wait(timeout)

    def stop(self) -> None:
        """Whatever state it is in, gone (by pid): the fixtures' way out."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines this node wrote (every start), those named `name` when given."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and name in (None, record.get("event")):
                    found.append(record)
        return found

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        return httpx.get(
            f"http://127.0.0.1:{self.port}{path}", headers=headers, timeout=5, **kwargs
        )

    def post(self, path: str, body: object, **headers: str) -> httpx.Response:
        sent = {"Authorization": f"Bearer {TOKEN}", **headers}
        url = f"http://127.0.0.1:{self.port}{path}"
        return httpx.post(url, headers=sent, json=body, timeout=5)

    def healthz(self) -> tuple[int, dict[str, Any]] | None:
        """(status, body) of this node's /healthz, None while nothing answers on its port."""
        try:
            response = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
        except httpx.HTTPError:
            return None
        return response.status_code, response.json()

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`ntfy-intake <args>` with this node's environment."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
        env["PYTHONPATH"] = str(SRC)
        env.update(self.env)
        return subprocess.run(
            [sys.executable, "-m", "ntfy_intake", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def status(self) -> dict[str, Any]:
        """`ntfy-intake status --json` with this node's environment."""
        done = self.command("status", "--json")
        assert done.returncode == 0, done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    def event_ids(self) -> list[str]:
        records = audit.read_records(self.state_dir / "audit")
        return [r["event_id"] for r in records if r["kind"] == "event"]
