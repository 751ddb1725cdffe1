"""A TCP proxy on 127.0.0.1 in front of PostgreSQL, for one node only: `cut()` stops every byte
both ways, as a link that went dead does (no RST, no FIN: what was sent is held, a new
connection is accepted and left waiting), `restore()` lets it all flow again, as a healed link
does with what TCP kept retransmitting; `refuse()` closes every connection and each new one, as
a restarting server does. Threads, one pair per connection; closed by `close`.

A proxy in user space cannot fake a lost packet: the kernel still ACKs what a client sends to
it, so the client's TCP keepalives and user timeout never fire. Only the node's own timers
(the lease's local deadline, the statement timeouts it asked the server for) see the cut.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65536
POLL_S = 0.1


class Proxy:
    """127.0.0.1:<port> -> `upstream` (host, port); see the module doc."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_S)
        self.port = int(self._listener.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.connections = 0
        self._spawn(self._accept)

    @classmethod
    def before(cls, dsn: str) -> Proxy:
        """A proxy in front of the server `dsn` names (host and port in its URL)."""
        parts = urlsplit(dsn)
        assert parts.hostname is not None and parts.port is not None, "a TCP DSN"
        return cls((parts.hostname, parts.port))

    def dsn(self, dsn: str) -> str:
        """`dsn` through this proxy."""
        parts = urlsplit(dsn)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def cut(self) -> None:
        self._flowing.clear()

    def restore(self) -> None:
        self._refusing.clear()
        self._flowing.set()

    def refuse(self) -> None:
        """A server restarting, as this node sees it: every open connection closed, and each
        new one closed at once, until `restore()`."""
        self._refusing.set()
        with self._lock:
            sockets, self._sockets = list(self._sockets), []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()  # wake every waiting pump, so each sees `closed` and ends
        with self._lock:
            sockets = list(self._sockets)
        for sock in [self._listener, *sockets]:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(5)

    @contextlib.contextmanager
    def running(self) -> Iterator[Proxy]:
        try:
            yield self
        finally:
            self.close()

    # -- the plumbing ------------------------------------------------------------------------

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _wait_flowing(self) -> bool:
        """Until bytes may flow (True), or the proxy is closed (False)."""
        while not self._flowing.wait(POLL_S):
            if self._closed.is_set():
                return False
        return not self._closed.is_set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._refusing.is_set():
                client.close()
                continue
            self._keep(client)
            self.connections += 1
            self._spawn(self._connect, client)

    def _connect(self, client: socket.socket) -> None:
        if not self._wait_flowing():  # accepted during a cut: left waiting, as a dead link does
            return
        try:
            server = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            client.close()
            return
        self._keep(server)
        self._spawn(self._pump, client, server)
        self._spawn(self._pump, server, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                if not self._wait_flowing():
                    return
                readable, _, _ = select.select([source], [], [], POLL_S)
                if not readable:
                    continue
                data = source.recv(CHUNK)
                # Read before a cut, sent after it: held until the link comes back.
                if not self._wait_flowing():
                    return
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
        except OSError:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
