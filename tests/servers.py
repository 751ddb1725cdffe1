"""One face for both ntfy servers, so a test can run unchanged against the bundled emulator and
the real ntfy server: everything goes over HTTP on loopback with the real clock.

    server = make_server(auth={"reader": ["alerts"]})   # the parametrized kind
    server.tokens["reader"]                              # a bearer token for that user

Auth follows ntfy's `auth-default-access: write-only`: anonymous clients may publish and read
nothing; each named user reads the listed topics (the emulator's token ACLs model exactly that).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ntfy_intake.emulator import EmulatorConfig, NtfyEmulator

from .real_ntfy import RealNtfy

KEEPALIVE = 5  # the real server's minimum; both servers use it so frames compare


def _token() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "tk_" + "".join(secrets.choice(alphabet) for _ in range(29))


@dataclass
class Server:
    kind: str  # "emulator" | "real"
    url: str
    tokens: dict[str, str] = field(default_factory=dict)
    real: RealNtfy | None = None
    emulator: NtfyEmulator | None = None

    def publish(self, topic: str, message: str = "", **headers: Any) -> dict[str, Any]:
        response = self.put(topic, message, **headers)
        assert response.status_code == 200, response.text
        event: dict[str, Any] = response.json()
        return event

    def put(self, topic: str, message: str | bytes = "", **headers: Any) -> httpx.Response:
        body = message.encode() if isinstance(message, str) else message
        return httpx.put(
            f"{self.url}/{topic}",
            content=body,
            headers={name.replace("_", "-"): str(value) for name, value in headers.items()},
            timeout=10,
        )

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=10, **kwargs)

    def poll(self, path: str, **params: str) -> list[dict[str, Any]]:
        response = self.get(path, params={"poll": "1", **params})
        assert response.status_code == 200, response.text
        return [json.loads(line) for line in response.text.splitlines()]


@contextlib.contextmanager
def start(
    kind: str,
    directory: Path,
    *,
    cache_duration: int = 43200,
    auth: Mapping[str, Sequence[str]] | None = None,
    rate_limits: bool = False,
    keepalive_interval: int = KEEPALIVE,
) -> Iterator[Server]:
    """Start one server of `kind`; stopped (by pid for the real one) on exit."""
    if kind == "real":
        real = RealNtfy(
            directory,
            cache_duration=f"{cache_duration}s",
            keepalive_interval=keepalive_interval,
            auth=auth is not None,
            default_access="write-only",
            rate_limits=rate_limits,
        )
        try:
            real.start()
            server = Server("real", real.url, real=real)
            for user, topics in (auth or {}).items():
                real.add_user(user)
                for topic in topics:
                    real.grant(user, topic, "read-only")
                server.tokens[user] = real.add_token(user)
            yield server
        finally:
            real.stop()
        return
    tokens = {user: _token() for user in auth or {}}
    config = EmulatorConfig(
        keepalive_interval=float(keepalive_interval),
        cache_duration=float(cache_duration),
        tokens={tokens[user]: list(topics) for user, topics in auth.items()}
        if auth is not None
        else None,
        request_limit=rate_limits,
        subscription_limit=30 if rate_limits else None,
    )
    with NtfyEmulator(config).running() as emulator:
        yield Server("emulator", emulator.url, tokens, emulator=emulator)
