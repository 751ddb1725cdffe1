"""Slow connections cannot starve the daemon: the HTTP surface is bounded, intake keeps its fds.

The flood: many connections to the daemon's HTTP port, each trickling one byte a second of a
request that never completes (and reconnecting when the daemon drops it), while alerts are
published. The daemon runs as a subprocess with its soft RLIMIT_NOFILE at 1024, as a Pi's default.
Before the bounds, ~1,100 such connections latched the audit log on EMFILE and `/healthz` stopped
answering. Set NTFY_INTAKE_TEST_FLOOD_CONNECTIONS / _SECONDS to run the full-size measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.surfaces import http_api, http_limits
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from .. import ports
from ..harness import audit_records, env_for, notices, query, store_of, wait_until

CONNECTIONS = int(os.environ.get("NTFY_INTAKE_TEST_FLOOD_CONNECTIONS", "1200"))
FLOOD_SECONDS = float(os.environ.get("NTFY_INTAKE_TEST_FLOOD_SECONDS", "20"))
SOFT_NOFILE = 1024
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4000


class Trickle:
    """`count` sockets, each sending one byte of REQUEST per `interval`; a dropped one reconnects."""

    def __init__(self, port: int, count: int, interval: float = 1.0) -> None:
        self.port = port
        self.count = count
        self.interval = interval
        self.stop = threading.Event()
        self.socks: list[tuple[socket.socket, int]] = []
        self.reconnects = 0
        self.thread = threading.Thread(target=self._run, name="trickle", daemon=True)

    def _open(self) -> tuple[socket.socket, int]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", self.port))
        return sock, 0

    def _run(self) -> None:
        self.socks = [self._open() for _ in range(self.count)]
        while not self.stop.wait(self.interval):
            for index, (sock, sent) in enumerate(self.socks):
                offset = sent % len(REQUEST)
                try:
                    self.socks[index] = (sock, sent + sock.send(REQUEST[offset : offset + 1]))
                except BlockingIOError:
                    pass  # still connecting (waiting in the listen backlog)
                except OSError as exc:
                    if exc.errno in (errno.ENOTCONN, errno.EAGAIN):
                        continue
                    sock.close()  # dropped by the daemon: come back, as an attacker would
                    self.socks[index] = self._open()
                    self.reconnects += 1

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        for sock, _ in self.socks:
            sock.close()


_free_port = ports.free_port


def _soft_nofile() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_NOFILE, hard))


@contextlib.contextmanager
def _daemon(env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")} | env
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ntfy_intake", "run"],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_soft_nofile,  # noqa: PLW1509 - only setrlimit, before exec
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def _open_fds(pid: int) -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return -1


@pytest.mark.one_engine("the HTTP surface's bounds; the store is only where alerts land")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_slow_connection_flood_latches_nothing_loses_nothing_and_healthz_recovers(
    tmp_path: Path,
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < CONNECTIONS + 200:
        pytest.skip(f"the test process needs {CONNECTIONS + 200} descriptors, hard limit {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    state = tmp_path / "state"
    port = _free_port()
    published: list[str] = []
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        receiver.running(tmp_path / "receiver.sqlite3") as triage,
    ):
        env = env_for(
            emu.url,
            state,
            http_listen=f"127.0.0.1:{port}",
            relay_url=triage.url,
            cadence_debounce="0s",
            cadence_cooldown="0s",
        )
        with _daemon(env, tmp_path / "daemon.log") as proc, httpx.Client(timeout=5.0) as http:
            wait_until(lambda: _healthz(http, port) == 200, timeout=60)
            emu.wait_for_subscribers(1)
            peak_fds = 0
            probes: list[int | None] = []  # /healthz during the flood: 200, 503 (busy) or None
            with Trickle(port, CONNECTIONS) as flood:
                deadline = time.monotonic() + FLOOD_SECONDS
                n = 0
                while time.monotonic() < deadline:
                    event = emu.publish("alerts", f"flood alert {n}", title=f"Alert {n}")
                    published.append(str(event["id"]))
                    n += 1
                    peak_fds = max(peak_fds, _open_fds(proc.pid))
                    probes.append(_healthz(http, port, timeout=1.0))
                    time.sleep(0.5)
                reconnects = flood.reconnects
            closed_at = time.monotonic()
            status = _healthz(http, port, timeout=1.0)
            healthz_after = time.monotonic() - closed_at
            assert proc.poll() is None, "the daemon died under the flood"
            wait_until(lambda: _recorded(state) >= set(published), timeout=60)
            wait_until(
                lambda: (
                    query(state, "SELECT count(*) FROM outbox WHERE state != 'delivered'") == [(0,)]
                ),
                timeout=60,
            )
        log_text = (tmp_path / "daemon.log").read_text(errors="replace")
    print(
        f"\nflood: {CONNECTIONS} trickling connections for {FLOOD_SECONDS:g}s, soft nofile "
        f"{SOFT_NOFILE}: peak daemon fds {peak_fds}, {reconnects} reconnects after deadline "
        f"aborts, {len(published)} alerts published and recorded, /healthz during the flood "
        f"{probes.count(200)}x 200, {probes.count(503)}x 503, {probes.count(None)}x no answer "
        f"within 1 s; /healthz {status} "
        f"{healthz_after * 1000:.0f} ms after the flood closed, daemon log {len(log_text)} bytes"
    )
    assert status == 200
    assert notices(state, "latch") == []
    assert "Too many open files" not in log_text
    outcomes = [r["event_id"] for r in audit_records(state) if r["kind"] == "event"]
    assert sorted(outcomes) == sorted(set(outcomes)) and set(outcomes) == set(published)
    assert peak_fds < SOFT_NOFILE


def _healthz(http: httpx.Client, port: int, timeout: float = 5.0) -> int | None:
    try:
        return http.get(f"http://127.0.0.1:{port}/healthz", timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def _recorded(state: Path) -> set[str]:
    with contextlib.suppress(Exception):
        return {str(r["event_id"]) for r in audit_records(state) if r["kind"] == "event"}
    return set()


# -- the bounds one by one, on a small scale, in one event loop ----------------------------------


def _app(tmp_path: Path, max_long_polls: int = 64) -> Any:
    return http_api.create_app(
        db_path=store_of(tmp_path),
        token="tok",
        notify=None,
        health=lambda: (True, {}),
        metrics_snapshot=dict,
        max_long_polls=max_long_polls,
    )


async def _serving(app: Any, limits: http_limits.Limits, scenario: Any) -> None:
    stop = asyncio.Event()
    bound: list[int] = []
    server = asyncio.create_task(
        http_api.serve(app, "127.0.0.1", 0, stop, bound.append, limits=limits)
    )
    try:
        while not bound:
            assert not server.done()
            await asyncio.sleep(0.01)
        await scenario(bound[0])
    finally:
        stop.set()
        await asyncio.wait_for(server, 30)


async def _request(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    try:
        return await asyncio.wait_for(reader.read(), 20)
    finally:
        writer.close()


def test_connections_past_the_cap_get_a_503_and_are_closed(tmp_path: Path) -> None:
    async def scenario(port: int) -> None:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.2)  # both accepted and counted
        answer = await _request(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503") and b'"error":"busy"' in answer
        for _, writer in held:
            writer.close()
        await asyncio.sleep(0.2)
        answer = await _request(
            port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 200")

    limits = http_limits.Limits(max_connections=2, busy_headroom=2)
    asyncio.run(_serving(_app(tmp_path), limits, scenario))


def test_headers_trickled_a_byte_at_a_time_cannot_outlast_the_header_timeout(
    tmp_path: Path,
) -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        closed_after = None
        for byte in REQUEST:  # one byte every 0.1 s: each byte would reset a keep-alive timer
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                closed_after = time.monotonic() - started
                break
            if reader.at_eof():
                closed_after = time.monotonic() - started
                break
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                    closed_after = time.monotonic() - started
                    break
        writer.close()
        assert closed_after is not None, "the trickled request was never cut off"
        assert closed_after < 10.0  # the header timeout is 1 s; the trickle would take 400 s

    limits = http_limits.Limits(header_timeout=1.0, read_timeout=2.0)
    asyncio.run(_serving(_app(tmp_path), limits, scenario))


def test_a_kept_alive_connection_is_bounded_again_after_each_response(tmp_path: Path) -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        # Then nothing but a byte now and then: the connection is cut, not kept forever.
        for _ in range(40):
            writer.write(b"G")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(), 0.25)
            if reader.at_eof():
                break
        assert reader.at_eof()
        writer.close()

    limits = http_limits.Limits(header_timeout=1.0, read_timeout=2.0)
    asyncio.run(_serving(_app(tmp_path), limits, scenario))


@pytest.mark.one_engine("the long-poll cap and deadlines of the HTTP surface")
def test_long_polls_past_the_cap_get_a_503(tmp_path: Path) -> None:
    wait = b"GET /v1/feed/agent/wait?timeout=5 HTTP/1.1\r\nHost: [::1]\r\nAuthorization: Bearer tok\r\n\r\n"

    async def scenario(port: int) -> None:
        first = await asyncio.open_connection("127.0.0.1", port)
        first[1].write(wait)
        await asyncio.sleep(0.5)  # the first wait is open
        answer = await _request(port, wait.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert answer.startswith(b"HTTP/1.1 503") and b"busy" in answer
        first[1].close()

    asyncio.run(_serving(_app(tmp_path, max_long_polls=1), http_limits.Limits(), scenario))


def test_caps_shrink_to_keep_the_descriptor_reserve() -> None:
    limits = http_limits.Limits()
    assert http_limits.fit_to_descriptors(limits, 1024, 40) == limits
    small = http_limits.fit_to_descriptors(limits, 256, 40)
    assert 40 + small.hard_cap + http_limits.FD_RESERVE <= 256
    assert small.max_connections >= 1 and small.max_long_polls >= 1


@pytest.mark.one_engine("the long-poll cap and deadlines of the HTTP surface")
def test_a_client_that_never_takes_its_answer_is_cut_off_at_the_response_timeout(
    tmp_path: Path,
) -> None:
    wait = b"GET /v1/feed/agent/wait?timeout=60 HTTP/1.1\r\nHost: [::1]\r\nAuthorization: Bearer tok\r\n\r\n"

    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(wait)
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError):  # aborted: EOF or a reset, no answer
            assert await asyncio.wait_for(reader.read(), 30) == b""
        assert time.monotonic() - started < 30.0  # the wait itself would have run 60 s
        writer.close()

    limits = http_limits.Limits(header_timeout=0.5, read_timeout=1.0, response_timeout=2.0)
    asyncio.run(_serving(_app(tmp_path), limits, scenario))
