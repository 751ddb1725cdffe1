"""The notify protocol against real AF_UNIX datagram sockets (a socket file and an abstract one)."""

from __future__ import annotations

import os
import select
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake.runtime.sdnotify import Notifier, one_line, watchdog_interval

MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the NUL


class Receiver:
    """The systemd side: a bound datagram socket and the address to put in NOTIFY_SOCKET."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address

    def recv(self) -> bytes:
        return self.sock.recv(65536)

    def pending(self) -> bool:
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable)


@pytest.fixture
def socket_dir(tmp_path: Path) -> Iterator[Path]:
    # pytest's tmp_path can exceed sun_path's 108 bytes; fall back to a short directory.
    if len(str(tmp_path / "notify.sock")) <= MAX_UNIX_PATH:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="sdn") as short:
        yield Path(short)


@pytest.fixture(params=["path", "abstract"])
def receiver(request: pytest.FixtureRequest, socket_dir: Path) -> Iterator[Receiver]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.settimeout(5)
    if request.param == "path":
        address = str(socket_dir / "notify.sock")
        sock.bind(address)
    else:
        name = f"ntfy-intake-test-{uuid.uuid4().hex}"
        address = "@" + name
        sock.bind("\0" + name)
    with sock:
        yield Receiver(sock, address)


def notifier_for(receiver: Receiver) -> Notifier:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": receiver.address})
    assert notifier.enabled
    return notifier


def test_lifecycle_datagrams_arrive_byte_exact(receiver: Receiver) -> None:
    notifier = notifier_for(receiver)
    assert notifier.ready()
    assert receiver.recv() == b"READY=1"
    assert notifier.ready("recovered 3 events")
    assert receiver.recv() == b"READY=1\nSTATUS=recovered 3 events"
    assert notifier.status("intake live: last frame 12s ago")
    assert receiver.recv() == b"STATUS=intake live: last frame 12s ago"
    assert notifier.watchdog()
    assert receiver.recv() == b"WATCHDOG=1"
    assert notifier.stopping()
    assert receiver.recv() == b"STOPPING=1"
    assert notifier.stopping("draining relay")
    assert receiver.recv() == b"STOPPING=1\nSTATUS=draining relay"
    assert notifier.last_error is None
    assert not receiver.pending()


def test_status_is_one_printable_line(receiver: Receiver) -> None:
    notifier = notifier_for(receiver)
    hostile = "disk\nfull\r\n\tWATCHDOG=1 \x1b[31mred\x1b[0m caf\u00e9 \u202eevil\u200b!"
    assert notifier.status(hostile)
    sent = receiver.recv()
    # The shared sanitizer strips whole ANSI sequences, not just their ESC byte.
    assert sent == "STATUS=disk full WATCHDOG=1 red caf\u00e9 evil\u200b!".encode()
    assert sent.count(b"\n") == 0


def test_status_is_capped(receiver: Receiver) -> None:
    assert notifier_for(receiver).status("x" * 5000)
    sent = receiver.recv().decode()
    assert len(sent) == len("STATUS=") + 400
    assert sent.endswith("\u2026")


def test_custom_fields_go_in_one_datagram(receiver: Receiver) -> None:
    notifier = notifier_for(receiver)
    assert notifier.send("EXTEND_TIMEOUT_USEC=30000000", "STATUS=replaying audit")
    assert receiver.recv() == b"EXTEND_TIMEOUT_USEC=30000000\nSTATUS=replaying audit"


@pytest.mark.parametrize(
    "fields",
    [(), ("READY",), ("=1",), ("STATUS=a\nWATCHDOG=1",), ("READY=1", "STATUS=x\ny")],
)
def test_malformed_fields_are_refused_and_nothing_is_sent(
    receiver: Receiver, fields: tuple[str, ...]
) -> None:
    notifier = notifier_for(receiver)
    assert notifier.send(*fields) is False
    assert notifier.last_error
    assert not receiver.pending()


def test_missing_socket_file_returns_false(socket_dir: Path) -> None:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(socket_dir / "gone.sock")})
    assert notifier.enabled
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    assert notifier.last_error is not None
    assert "gone.sock" in notifier.last_error


def test_missing_abstract_socket_returns_false() -> None:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": f"@no-such-{uuid.uuid4().hex}"})
    assert notifier.watchdog() is False
    assert notifier.last_error


def test_a_file_that_is_not_a_socket_returns_false(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    assert Notifier.from_environ({"NOTIFY_SOCKET": str(plain)}).ready() is False


def test_full_queue_returns_false_instead_of_blocking(receiver: Receiver) -> None:
    """A receiver that never reads fills the queue; sends must fail fast, not hang the loop."""
    notifier = Notifier(receiver.address, timeout=0.05)
    assert notifier.watchdog() is True
    started = time.monotonic()
    for _ in range(100_000):
        if not notifier.watchdog():
            break
    else:
        pytest.fail("the datagram queue never filled")
    assert time.monotonic() - started < 5
    assert notifier.last_error is not None
    assert receiver.recv() == b"WATCHDOG=1"  # what was queued is intact


@pytest.mark.parametrize("value", [None, "", "@", "vsock:2:1234", "relative/notify.sock"])
def test_without_a_usable_notify_socket_the_notifier_is_a_no_op(value: str | None) -> None:
    environ = {} if value is None else {"NOTIFY_SOCKET": value}
    notifier = Notifier.from_environ(environ)
    assert notifier.enabled is False
    assert notifier.ready("x") is False
    assert notifier.status("x") is False
    assert notifier.watchdog() is False
    assert notifier.stopping() is False
    assert notifier.last_error is None  # nothing went wrong: there was nothing to do


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "90000000"}, 45.0),
        ({"WATCHDOG_USEC": "90000000", "WATCHDOG_PID": "4242"}, 45.0),
        ({"WATCHDOG_USEC": "90000000", "WATCHDOG_PID": "4243"}, None),  # inherited, not ours
        ({"WATCHDOG_USEC": "90000000", "WATCHDOG_PID": ""}, None),
        ({"WATCHDOG_USEC": "90000000", "WATCHDOG_PID": "x"}, None),
        ({"WATCHDOG_USEC": "1"}, 0.0000005),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "1.5"}, None),
        ({"WATCHDOG_USEC": "\u00b2"}, None),  # isdigit() but not int()-able
        ({"WATCHDOG_USEC": ""}, None),
        ({"WATCHDOG_PID": "4242"}, None),
    ],
)
def test_watchdog_interval(environ: dict[str, str], expected: float | None) -> None:
    assert watchdog_interval(environ, 4242) == expected


def test_watchdog_interval_for_this_process() -> None:
    environ = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_interval(environ, os.getpid()) == 1.0


def test_one_line_keeps_ordinary_text() -> None:
    assert one_line("  intake   live  ") == "intake live"
    assert one_line("") == ""
