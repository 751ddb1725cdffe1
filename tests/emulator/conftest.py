"""Fixtures for the emulator suite: a fake clock, emulators on loopback, and a raw-socket stream
reader that sees every byte (so "nothing was sent" and "the body ended without its last chunk"
can be asserted exactly)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from ntfy_intake.emulator import EmulatorConfig, NtfyEmulator

T0 = 1_700_000_000


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = float(now)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RawStream:
    """A GET over a plain socket, with an incremental HTTP/1.1 chunked-body decoder."""

    def __init__(self, base_url: str, target: str, headers: dict[str, str] | None = None) -> None:
        url = urlsplit(base_url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=5)
        lines = [f"GET {target} HTTP/1.1", f"Host: {url.netloc}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.raw = b""  # undecoded bytes
        self.body = b""  # decoded body bytes not yet consumed
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.chunked = False
        self.complete = False  # saw the terminating zero-size chunk
        self.eof = False

    def _recv(self, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or self.eof:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.raw += data
        return True

    def read_head(self, timeout: float = 2.0) -> int:
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.raw:
            if not self._recv(deadline):
                raise TimeoutError("no response head")
        head, self.raw = self.raw.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        for line in header_lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.chunked = self.headers.get("transfer-encoding") == "chunked"
        if not self.chunked:
            length = int(self.headers.get("content-length", "0"))
            while len(self.raw) < length and self._recv(deadline):
                pass
            self.body, self.raw = self.raw[:length], b""
            self.complete = True
        return self.status

    def _decode(self) -> None:
        while self.chunked and not self.complete and b"\r\n" in self.raw:
            size_line, rest = self.raw.split(b"\r\n", 1)
            size = int(size_line, 16)
            if len(rest) < size + 2:
                return
            self.body += rest[:size]
            self.raw = rest[size + 2 :]
            if size == 0:
                self.complete = True

    def line(self, timeout: float = 2.0) -> str:
        if self.status is None:
            self.read_head(timeout)
        deadline = time.monotonic() + timeout
        while True:
            self._decode()
            if b"\n" in self.body:
                line, self.body = self.body.split(b"\n", 1)
                return line.decode()
            if self.complete or not self._recv(deadline):
                raise TimeoutError(f"no line (complete={self.complete}, eof={self.eof})")

    def event(self, timeout: float = 2.0) -> dict[str, Any]:
        value = json.loads(self.line(timeout))
        assert isinstance(value, dict)
        return value

    def events_until_quiet(self, quiet: float = 0.3) -> list[dict[str, Any]]:
        events = []
        with contextlib.suppress(TimeoutError):
            while True:
                events.append(self.event(quiet))
        return events

    def no_bytes_for(self, seconds: float) -> bool:
        """True when not a single byte arrives within `seconds`."""
        before = len(self.raw)
        deadline = time.monotonic() + seconds
        while self._recv(deadline):
            pass
        return len(self.raw) == before and not self.eof

    def ending(self, timeout: float = 2.0) -> str:
        """Read to the end: 'clean' (terminating chunk) or 'cut' (EOF without it)."""
        if self.status is None:
            self.read_head(timeout)
        deadline = time.monotonic() + timeout
        while True:
            self._decode()
            if self.complete:
                return "clean"
            if self.eof:
                return "cut"
            if not self._recv(deadline) and not self.eof:
                raise TimeoutError("the stream did not end")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_emulator(clock: FakeClock) -> Iterator[Callable[..., NtfyEmulator]]:
    """Start emulators (fake clock, 30 s keepalive, no rate limits unless overridden); all stop
    at teardown."""
    with contextlib.ExitStack() as stack:

        def make(**overrides: Any) -> NtfyEmulator:
            # The suite makes many requests per test: ntfy's limits are off unless a test
            # turns them on (the parity tests of the limits do).
            settings: dict[str, Any] = {
                "clock": clock,
                "keepalive_interval": 30.0,
                "request_limit": False,
                "subscription_limit": None,
            }
            settings.update(overrides)
            return stack.enter_context(NtfyEmulator(EmulatorConfig(**settings)).running())

        yield make


@pytest.fixture
def emu(make_emulator: Callable[..., NtfyEmulator]) -> NtfyEmulator:
    return make_emulator()


@pytest.fixture
def client(emu: NtfyEmulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=emu.url, timeout=5) as http:
        yield http


@pytest.fixture
def open_stream() -> Iterator[Callable[..., RawStream]]:
    """open_stream(emu, "/t/json?since=all", headers={...}) -> RawStream; closed at teardown."""
    streams: list[RawStream] = []

    def opener(
        emulator: NtfyEmulator, target: str, headers: dict[str, str] | None = None
    ) -> RawStream:
        stream = RawStream(emulator.url, target, headers)
        streams.append(stream)
        return stream

    yield opener
    for stream in streams:
        stream.close()


def poll(client: httpx.Client, path: str, **params: str) -> list[dict[str, Any]]:
    """GET <path>?poll=1&... and decode the NDJSON body."""
    response = client.get(path, params={"poll": "1", **params})
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


@pytest.fixture
def polled() -> Callable[..., list[dict[str, Any]]]:
    return poll
