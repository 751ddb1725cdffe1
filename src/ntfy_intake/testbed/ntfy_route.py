"""One node's route to ntfy, as a loopback TCP proxy the drill controls (DESIGN.md section 11's
faults): `cut` it (the listener closed, every connection reset: connections are refused, as when a
box loses its route), `silence` it (connections stay open and new ones are accepted, what the node
sends still reaches ntfy, but not one byte comes back, keepalives included: a zombie link), and
`restore` it (the same port again; a silenced connection is reset rather than resumed, since the
bytes it lost would leave the stream torn mid-line).

One thread runs every socket through a selector, so a reset is the only close of its socket and
really sends the RST (a close from another thread while a recv blocks on it would not).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Literal
from urllib.parse import urlsplit

State = Literal["open", "cut", "silent"]
CHUNK = 65536
REBIND_FOR_S = 5.0  # restore: how long to retry binding the same port
CALL_BOUND_S = 10.0  # cut/silence/restore: the proxy thread must have done it by then


class RouteError(RuntimeError):
    """The proxy could not do what was asked (its port taken, its thread gone)."""


class _Pipe:
    """One connection: the node's end and ntfy's, with what each is still owed."""

    def __init__(self, client: socket.socket, upstream: socket.socket, *, silent: bool) -> None:
        self.client = client
        self.upstream = upstream
        self.silent = silent
        self.owed: dict[socket.socket, bytearray] = {client: bytearray(), upstream: bytearray()}

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client


class _Call:
    """One action for the proxy's thread, and its answer."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action
        self.done = threading.Event()
        self.error: OSError | None = None


class NtfyRoute:
    """A loopback proxy from `url` (its own port) to `upstream` (an http://127.0.0.1:PORT URL)."""

    def __init__(self, upstream: str, name: str) -> None:
        parts = urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream needs a host and a port: {upstream}")
        self.upstream = (parts.hostname, parts.port)
        self.name = name
        self.state: State = "open"
        self.accepted = 0  # connections, over the proxy's life
        self.dropped_bytes = 0  # from ntfy, while silent
        self.resets = 0
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._calls: list[_Call] = []
        self._lock = threading.Lock()
        self._pipes: set[_Pipe] = set()
        self._listener: socket.socket | None = self._listen(0)
        self.port = self._listener.getsockname()[1]
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"ntfy-route-{name}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- what the drill asks ---------------------------------------------------------------------

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        self._call(self._do_cut)

    def silence(self) -> None:
        """From now on nothing from ntfy reaches the node, on open and new connections alike."""
        self._call(self._do_silence)

    def restore(self) -> None:
        """Forward again (the same port); silenced connections are reset."""
        self._call(self._do_restore)

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(RouteError):
                self._call(self._do_close)
            self._thread.join(CALL_BOUND_S)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def describe(self) -> str:
        return (
            f"{self.state}, {self.accepted} connections, {self.resets} reset,"
            f" {self.dropped_bytes} bytes from ntfy dropped"
        )

    def _call(self, action: Callable[[], None]) -> None:
        """Run `action` in the proxy's thread and wait for it: the sockets are that thread's."""
        call = _Call(action)
        with self._lock:
            self._calls.append(call)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if not call.done.wait(CALL_BOUND_S):
            raise RouteError(f"route {self.name}: the proxy thread did not answer")
        if call.error is not None:
            raise RouteError(f"route {self.name}: {call.error}")

    # -- the proxy's thread ----------------------------------------------------------------------

    def _listen(self, port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", port))
            listener.listen(64)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, "listener")
        return listener

    def _run(self) -> None:
        while not self._stopping:
            for key, mask in self._sel.select(0.2):
                if key.data == "wake":
                    self._run_calls()
                elif key.data == "listener":
                    self._accept()
                else:
                    pipe: _Pipe = key.data
                    sock: socket.socket = key.fileobj  # type: ignore[assignment]
                    if pipe in self._pipes and mask & selectors.EVENT_WRITE:
                        self._send_owed(pipe, sock)
                    if pipe in self._pipes and mask & selectors.EVENT_READ:
                        self._read(pipe, sock)

    def _run_calls(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_r.recv(CHUNK)
        with self._lock:
            calls, self._calls = self._calls, []
        for call in calls:
            try:
                call.action()
            except OSError as exc:
                call.error = exc
            call.done.set()

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=2)
        except OSError:
            _reset(client)
            return
        self.accepted += 1
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pipe = _Pipe(client, upstream, silent=self.state == "silent")
        self._pipes.add(pipe)
        for sock in (client, upstream):
            self._sel.register(sock, selectors.EVENT_READ, pipe)

    def _read(self, pipe: _Pipe, sock: socket.socket) -> None:
        try:
            data = sock.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            self._end(pipe, reset=True)
            return
        if not data:
            self._end(pipe, reset=False)
            return
        if sock is pipe.upstream and pipe.silent:
            self.dropped_bytes += len(data)
            return
        peer = pipe.peer(sock)
        pipe.owed[peer] += data
        self._send_owed(pipe, peer)

    def _send_owed(self, pipe: _Pipe, sock: socket.socket) -> None:
        owed = pipe.owed[sock]
        try:
            while owed:
                sent = sock.send(owed)
                del owed[:sent]
        except BlockingIOError:
            pass
        except OSError:
            self._end(pipe, reset=True)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if owed else 0)
        self._sel.modify(sock, events, pipe)

    def _end(self, pipe: _Pipe, *, reset: bool) -> None:
        """Close both ends: an orderly end gets what it is still owed first (briefly)."""
        self._pipes.discard(pipe)
        for sock in (pipe.client, pipe.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            if reset:
                _reset(sock)
                continue
            with contextlib.suppress(OSError):
                sock.setblocking(True)
                sock.settimeout(0.5)
                sock.sendall(pipe.owed[sock])
            sock.close()
        if reset:
            self.resets += 1

    def _do_cut(self) -> None:
        self.state = "cut"
        if self._listener is not None:
            self._sel.unregister(self._listener)
            self._listener.close()
            self._listener = None
        for pipe in list(self._pipes):
            self._end(pipe, reset=True)

    def _do_silence(self) -> None:
        self.state = "silent"
        for pipe in self._pipes:
            pipe.silent = True

    def _do_restore(self) -> None:
        for pipe in [p for p in self._pipes if p.silent]:
            self._end(pipe, reset=True)
        if self._listener is None:
            deadline = time.monotonic() + REBIND_FOR_S
            while True:
                try:
                    self._listener = self._listen(self.port)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        self.state = "open"

    def _do_close(self) -> None:
        self._do_cut()
        self._stopping = True


def _reset(sock: socket.socket) -> None:
    """Close with an RST (linger 0), not a FIN: the peer sees its connection reset."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
