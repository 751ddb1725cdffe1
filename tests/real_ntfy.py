"""The real ntfy server for tests: `ntfy serve` on a free loopback port, configured per test.

The binary is found through `NTFY_BIN` (which `.ci/run` sets from `scripts/build-ntfy`), else
`ntfy` on PATH when it is the Go server. Without one, every `real_ntfy` test skips with one
reason; under CI (`CI` set) a missing binary is a failure unless `.ci/run` said why it cannot be
had here (`NTFY_UNAVAILABLE`, written by the build script).

Users, tokens and ACLs are made with ntfy's own `ntfy user`, `ntfy token` and `ntfy access`.
The process is stopped by pid: SIGTERM with a bounded wait, then SIGKILL; `kill9()` for crash tests.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from . import ports

KEEPALIVE_MIN = 5  # ntfy refuses a keepalive-interval below 5 s
TOKEN_RE = re.compile(r"tk_[a-z0-9]{29}")


def binary() -> str | None:
    """The ntfy server binary to test against, or None."""
    configured = os.environ.get("NTFY_BIN")
    if configured:
        return configured
    found = shutil.which("ntfy")
    if found is None:
        return None
    # PyPI's `ntfy` is an unrelated notifier with the same command name: check it is the server.
    probe = subprocess.run(
        [found, "serve", "--help"], capture_output=True, text=True, timeout=10, check=False
    )
    return found if "listen-http" in probe.stdout + probe.stderr else None


def missing_reason() -> str:
    why = os.environ.get("NTFY_UNAVAILABLE")
    if why:
        return f"real ntfy server unavailable here: {why}"
    return (
        "no real ntfy server: set NTFY_BIN=/path/to/ntfy, or run scripts/build-ntfy "
        "(needs Go >= 1.24 and gcc) and export NTFY_BIN=$(scripts/build-ntfy)"
    )


def require_binary() -> str:
    found = binary()
    if found is not None:
        return found
    if os.environ.get("CI") and not os.environ.get("NTFY_UNAVAILABLE"):
        pytest.fail("CI must run the real-server tests: NTFY_BIN is not set", pytrace=False)
    pytest.skip(missing_reason())


free_port = ports.free_port


def _yaml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


class RealNtfy:
    """One `ntfy serve` process with a generated server.yml in its own directory."""

    def __init__(
        self,
        directory: Path,
        *,
        cache_duration: str = "12h",
        keepalive_interval: int = KEEPALIVE_MIN,
        auth: bool = False,
        default_access: str = "read-write",
        rate_limits: bool = False,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        self.binary = require_binary()
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cache_file = self.dir / "cache.db"
        self.auth_file = self.dir / "user.db" if auth else None
        settings: dict[str, object] = {
            "base-url": self.url,
            "listen-http": f"127.0.0.1:{self.port}",
            "cache-file": str(self.cache_file),
            "cache-duration": cache_duration,
            "keepalive-interval": f"{max(keepalive_interval, KEEPALIVE_MIN)}s",
            "log-level": "info",
            # The web app is not in the Go module (build-ntfy embeds placeholders); the emulator
            # models ntfy with `web-root: disable` too, so /, /docs and /static are 404 40401.
            "web-root": "disable",
        }
        if auth:
            settings["auth-file"] = str(self.auth_file)
            settings["auth-default-access"] = default_access
        if not rate_limits:
            # ntfy's request and subscription limiters are on by default; bulk tests lift them
            # explicitly, as the demo and the drill do with the emulator.
            settings["visitor-request-limit-exempt-hosts"] = "127.0.0.1"
            settings["visitor-subscription-limit"] = 1000
            settings["visitor-message-daily-limit"] = 0
        settings.update(extra or {})
        self.config = self.dir / "server.yml"
        self.config.write_text(
            "".join(f"{key}: {_yaml_value(value)}\n" for key, value in settings.items())
        )
        self.log_path = self.dir / "ntfy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout: float = 20.0) -> RealNtfy:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "serve", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ntfy exited at start:\n{self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"ntfy did not answer:\n{self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self, *, keep_cache: bool = True) -> RealNtfy:
        """Start again on the same port, with or without the cache file."""
        self.stop()
        if not keep_cache:
            for path in self.dir.glob("cache.db*"):
                path.unlink()
        return self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- ntfy's own admin commands --------------------------------------------------------------
    def _admin(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        done = subprocess.run(
            [self.binary, *args[:1], "--config", str(self.config), *args[1:]],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**os.environ, **(env or {})},
        )
        if done.returncode != 0:
            raise RuntimeError(f"ntfy {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout + done.stderr

    def add_user(self, name: str, password: str = "pw-for-tests", role: str = "user") -> None:
        self._admin("user", "add", f"--role={role}", name, env={"NTFY_PASSWORD": password})

    def add_token(self, user: str) -> str:
        match = TOKEN_RE.search(self._admin("token", "add", user))
        assert match is not None, "ntfy token add printed no token"
        return match.group(0)

    def grant(self, user: str, topic: str, permission: str) -> None:
        self._admin("access", user, topic, permission)

    # -- an HTTP client's view ------------------------------------------------------------------
    def publish(self, topic: str, message: str = "", **headers: Any) -> dict[str, Any]:
        response = httpx.put(
            f"{self.url}/{topic}",
            content=message.encode(),
            headers={name.replace("_", "-"): str(value) for name, value in headers.items()},
            timeout=10,
        )
        response.raise_for_status()
        event: dict[str, Any] = response.json()
        return event
