"""An oversize or malformed body is answered with its 4xx, and the client reads that 4xx.

The failure: a 1 MB `POST /v1/notify` sometimes got no answer at all, only a connection reset.
The surface answered 413 and closed while the client was still sending; the kernel resets a
socket closed with unread data, and the reset discards the 413 from the client's receive buffer
before the client (which reads only after it has sent everything) gets to it. urllib always sends
`Connection: close`, so its oversize POSTs were hit every time.

These tests run the real daemon surface, `http_api.serve` with its guarded protocol, in a thread
of its own, and send it oversize and malformed bodies from urllib, httpx, curl and a raw socket,
many at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.surfaces import http_api, http_limits

TOKEN = "tok-linger-7Hq2Xv9Lp4Ws"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": "k1"}
BIG = 1024 * 1024
PARALLEL = 16
ROUNDS = 4


@contextlib.contextmanager
def daemon_surface(
    tmp_path: Path, limits: http_limits.Limits | None = None
) -> Iterator[tuple[int, list[str]]]:
    """`http_api.serve` as the daemon runs it, in its own thread and loop; yields (port, notified)."""
    notified: list[str] = []

    async def notify(text: str, key: str) -> tuple[int, Mapping[str, Any]]:
        notified.append(text)
        return 202, {"key": key, "result": "queued"}

    app = http_api.create_app(
        db_path=tmp_path / "intake.sqlite3",
        token=TOKEN,
        notify=notify,
        health=lambda: (True, {}),
        metrics_snapshot=dict,
    )
    bound: list[int] = []
    ready = threading.Event()
    handles: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
    failure: list[BaseException] = []

    def on_bound(port: int) -> None:
        bound.append(port)
        ready.set()

    async def main() -> None:
        stop = asyncio.Event()
        handles.append((asyncio.get_running_loop(), stop))
        await http_api.serve(app, "127.0.0.1", 0, stop, on_bound, limits=limits)

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # re-raised in the test thread
            failure.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="surface", daemon=True)
    thread.start()
    assert ready.wait(15) and bound, failure
    try:
        yield bound[0], notified
    finally:
        loop, stop = handles[0]
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        assert not thread.is_alive(), "the surface did not stop"
    assert not failure, failure


def open_descriptors() -> int:
    gc.collect()  # a client socket dropped unclosed is closed now, not counted
    return len(os.listdir("/proc/self/fd"))


def _released(baseline: int) -> float:
    """Seconds until the surface holds no connection's descriptor (each lingers <= LINGER_S)."""
    started = time.monotonic()
    while open_descriptors() > baseline and time.monotonic() - started < http_limits.LINGER_S + 5:
        time.sleep(0.05)
    assert open_descriptors() <= baseline, "connections still open past their linger"
    return time.monotonic() - started


def _oversize(size: int = BIG) -> bytes:
    return json.dumps({"text": "x", "pad": "y" * size}).encode()


# -- clients: each returns the status it read, or the error it got instead -----------------------


def slowly(body: bytes, pieces: int = 16) -> Iterator[bytes]:
    """The body in `pieces`, 10 ms apart: the answer certainly comes while most is still to send."""
    step = -(-len(body) // pieces)
    for offset in range(0, len(body), step):
        yield body[offset : offset + step]
        time.sleep(0.01)


def via_urllib(port: int, body: bytes, *, slow: bool = False) -> int | str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/notify",
        data=slowly(body) if slow else body,
        headers={**HEADERS, "Content-Type": "application/json", "Content-Length": str(len(body))},
        method="POST",
    )
    try:
        with opener.open(request, timeout=20) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)
    except Exception as exc:  # the failure being counted
        return f"urllib: {type(exc).__name__}: {exc}"


def via_httpx(port: int, body: bytes, *, slow: bool = False) -> int | str:
    headers = {**HEADERS, "Content-Length": str(len(body))}
    try:
        with httpx.Client(trust_env=False, timeout=20) as client:
            response = client.post(
                f"http://127.0.0.1:{port}/v1/notify",
                headers=headers,
                content=slowly(body) if slow else body,
            )
            return response.status_code
    except Exception as exc:  # the failure being counted
        return f"httpx: {type(exc).__name__}: {exc}"


def _curl(port: int, body_file: Path, *extra: str) -> int | str:
    curl = shutil.which("curl")
    assert curl is not None
    args = [curl, "-sS", "--noproxy", "*", "--max-time", "20", "-o", "/dev/null"]
    args += ["-w", "%{http_code}", *extra, "--data-binary", f"@{body_file}"]
    for name, value in HEADERS.items():
        args += ["-H", f"{name}: {value}"]
    done = subprocess.run(  # fixed arguments, loopback only
        [*args, f"http://127.0.0.1:{port}/v1/notify"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    code = done.stdout.strip()
    if done.returncode == 0 and code.isdigit() and code != "000":
        return int(code)
    return f"curl{' '.join(extra)}: rc {done.returncode} {code} {done.stderr.strip()}"


def via_raw_socket(port: int, head: bytes, body: bytes, *, slow: bool = False) -> int | str:
    """Send everything first, then read, as urllib does."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            sock.sendall(head)
            for piece in slowly(body) if slow else [body]:
                sock.sendall(piece)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
                if b"\r\n" in answer:
                    break
    except OSError as exc:
        return f"raw: {type(exc).__name__}: {exc}"
    status = answer.split(b"\r\n", 1)[0].split(b" ")
    if len(status) >= 2 and status[1].isdigit():
        return int(status[1])
    return f"raw: no status line, read {answer[:60]!r}"


def _hammer(calls: list[Callable[[], int | str]]) -> Counter[int | str]:
    with ThreadPoolExecutor(PARALLEL) as pool:
        return Counter(pool.map(lambda call: call(), calls))


def _report(name: str, outcomes: Counter[int | str], expected: int) -> None:
    failed = sum(n for outcome, n in outcomes.items() if outcome != expected)
    total = sum(outcomes.values())
    print(f"\n{name}: {failed}/{total} did not read {expected}: {dict(outcomes)}")


def _head(content_length: int | str, *extra: str) -> bytes:
    lines = [
        "POST /v1/notify HTTP/1.1",
        "Host: 127.0.0.1",
        *(f"{name}: {value}" for name, value in HEADERS.items()),
        f"Content-Length: {content_length}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- the tests ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_oversize_notify_is_read_as_413_not_a_reset_by_urllib_httpx_and_curl_under_load(
    tmp_path: Path,
) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (Debian: apt-get install -y curl)")
    body = _oversize()
    huge_body = _oversize(8 * BIG)
    body_file = tmp_path / "big.json"
    body_file.write_bytes(body)
    with daemon_surface(tmp_path) as (port, notified):
        baseline = open_descriptors()
        calls: list[Callable[[], int | str]] = []
        for _ in range(ROUNDS * PARALLEL // 4):
            calls += [
                lambda: via_urllib(port, body),
                lambda: via_httpx(port, body),
                lambda: _curl(port, body_file),  # Expect: 100-continue, curl's default
                lambda: _curl(port, body_file, "-H", "Expect:"),  # the body straight away
            ]
        outcomes = _hammer(calls)
        # The same clients sending slowly: the 413 is certainly written while most of the body
        # is still to come. (urllib sends `Connection: close`; the raw client does too.)
        slow_head = _head(len(body), "Connection: close")
        slow_calls: list[Callable[[], int | str]] = []
        for _ in range(ROUNDS * PARALLEL // 4):
            slow_calls += [
                lambda: via_urllib(port, body, slow=True),
                lambda: via_httpx(port, body, slow=True),
                lambda: _curl(port, body_file, "-H", "Expect:", "--limit-rate", "4M"),
                lambda: via_raw_socket(port, slow_head, body, slow=True),
            ]
        slow = _hammer(slow_calls)
        huge = _hammer([lambda: via_urllib(port, huge_body)] * PARALLEL)
        released = _released(baseline)
    _report("oversize notify", outcomes, 413)
    _report("oversize notify sent slowly", slow, 413)
    _report("8 MB notify from urllib", huge, 413)
    print(f"all connections closed {released:.2f} s after the last answer")
    assert outcomes == Counter({413: len(calls)})
    assert slow == Counter({413: len(slow_calls)})
    assert huge == Counter({413: PARALLEL})
    assert notified == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_malformed_body_gets_its_400_read_not_a_reset(tmp_path: Path) -> None:
    bad_length = _head("1048576x")  # h11 refuses the framing before any body is read
    bad_chunks = _head(0).replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    # A valid first chunk, then a chunk-size line that is not hex, then a megabyte more.
    garbage = b"10\r\n" + b"z" * 16 + b"\r\n" + b"not-hex\r\n" + b"q" * BIG
    with daemon_surface(tmp_path) as (port, notified):
        baseline = open_descriptors()
        # Sent slowly, so the 400 is certainly written while most of the body is still to come.
        outcomes = _hammer(
            [lambda: via_raw_socket(port, bad_length, b"q" * BIG, slow=True)] * (PARALLEL * 2)
            + [lambda: via_raw_socket(port, bad_chunks, garbage, slow=True)] * (PARALLEL * 2)
        )
        _released(baseline)
    _report("malformed body", outcomes, 400)
    assert outcomes == Counter({400: PARALLEL * 4})
    assert notified == []


def test_a_client_that_keeps_sending_after_its_413_is_cut_off_after_the_linger(
    tmp_path: Path,
) -> None:
    with daemon_surface(tmp_path) as (port, _):
        baseline = open_descriptors()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(_head(100 * BIG))
            answer = sock.recv(65536)  # the 413 comes at once, on the headers
            answered = time.monotonic()
            cut_after = None
            while time.monotonic() - answered < http_limits.LINGER_S + 10:
                try:
                    sock.sendall(b"q" * 65536)  # on and on, never reading again
                except OSError:
                    cut_after = time.monotonic() - answered
                    break
                time.sleep(0.01)
        _released(baseline)
    assert answer.startswith(b"HTTP/1.1 413")
    assert cut_after is not None, "a client sending for ever held its connection for ever"
    assert http_limits.LINGER_S - 0.5 < cut_after < http_limits.LINGER_S + 3
