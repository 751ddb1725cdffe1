"""The drill's per-node route to ntfy (testbed/ntfy_route.py), on real sockets: forwarded both
ways; cut, a connection is refused and an open one reset; silent, the node's bytes still reach
the server but nothing comes back while the connection stays open; restored on the same port."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from ntfy_intake.testbed.ntfy_route import NtfyRoute


class Upstream:
    """A server that answers every line it gets with `got <line>` and remembers it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lines: list[bytes] = []
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        # The proxy resets its end of a cut or silenced connection: the end of this one too.
        with contextlib.suppress(OSError), conn, conn.makefile("rb") as lines:
            for line in lines:
                self.lines.append(line.strip())
                conn.sendall(b"got " + line)

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def route() -> Iterator[tuple[NtfyRoute, Upstream]]:
    upstream = Upstream()
    proxy = NtfyRoute(f"http://127.0.0.1:{upstream.port}", "pi")
    try:
        yield proxy, upstream
    finally:
        proxy.close()
        upstream.close()


def ask(sock: socket.socket, line: bytes) -> bytes:
    sock.sendall(line + b"\n")
    return sock.recv(100)


def test_a_cut_route_refuses_and_resets_and_a_restored_one_forwards_on_the_same_port(
    route: tuple[NtfyRoute, Upstream],
) -> None:
    proxy, _ = route
    port = proxy.port
    held = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert ask(held, b"one") == b"got one\n"
    proxy.cut()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    with pytest.raises(ConnectionResetError):
        ask(held, b"two")
    held.close()
    proxy.restore()
    assert proxy.port == port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as again:
        assert ask(again, b"three") == b"got three\n"
    assert proxy.resets >= 1


def test_a_silent_route_keeps_the_connection_open_and_returns_nothing(
    route: tuple[NtfyRoute, Upstream],
) -> None:
    proxy, upstream = route
    held = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    assert ask(held, b"before") == b"got before\n"
    proxy.silence()
    held.settimeout(0.5)
    with pytest.raises(TimeoutError):  # open, not reset, not ended: just silent
        ask(held, b"during")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as fresh:
        fresh.settimeout(0.5)
        with pytest.raises(TimeoutError):  # a new connection is accepted, and silent too
            ask(fresh, b"fresh")
    assert b"during" in upstream.lines and b"fresh" in upstream.lines  # what the node sent went
    assert proxy.dropped_bytes >= len(b"got during\n")
    proxy.restore()
    held.settimeout(5)
    with pytest.raises(ConnectionResetError):  # a silenced stream is reset, never resumed torn
        ask(held, b"after")
    held.close()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as again:
        assert ask(again, b"after") == b"got after\n"
