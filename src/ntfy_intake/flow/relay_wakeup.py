"""The relay's wakeup: one event its loop waits on, telling "rows may be due" from "an attempt
ended", so the turn that settles an ended attempt does not also claim (a write transaction that
would find nothing) unless something else asked it to look.

And the nudge from another process (issue 36): `redrive` on the command line writes the store
itself, so the relay, asleep until its next due row, would only notice at its long poll. The
daemon listens on a datagram socket in the state directory (`NUDGE_SOCKET`); the CLI sends one
empty datagram there after its redrive committed, and the relay looks at once. Nothing rides on
it: a lost nudge (no daemon, a daemon on another host of a PostgreSQL cluster, a full queue) is
the long poll's (`relay.POLL_S`). Waiting on the socket costs no wake-up: the event loop's
selector holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

NUDGE_SOCKET = "relay-nudge.sock"
_SUN_PATH_MAX = 107  # sun_path is 108 bytes with its NUL


class Wakeup(asyncio.Event):
    """The relay's wakeup. `set` (a release it was not handed, a redrive, a test): rows may be
    due, so the next turn claims. `settle` (an attempt ended): a turn settles it, and claims only
    if something else asked to look; an ended attempt makes nothing new due."""

    def __init__(self) -> None:
        super().__init__()
        self.look = False

    def set(self) -> None:
        self.look = True
        super().set()

    def settle(self) -> None:
        super().set()

    def clear(self) -> None:
        self.look = False
        super().clear()


@contextlib.contextmanager
def _address(path: Path) -> Iterator[str]:
    """`path` as a socket address: a state directory deeper than sun_path allows is reached
    through its open descriptor (/proc/self/fd/N/name)."""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


class NudgeListener:
    """The daemon's side: the socket bound in `state_dir`, each datagram calling `wake` from
    the event loop. `close` stops listening and removes the socket file."""

    def __init__(self, state_dir: Path, wake: Callable[[], None]) -> None:
        self.path = state_dir / NUDGE_SOCKET
        self._wake = wake
        self._loop = asyncio.get_running_loop()
        # A file left by a daemon that died: this process holds the state directory's lock.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with _address(self.path) as address:
                self._sock.bind(address)
            os.chmod(self.path, 0o600)  # the daemon's user (the CLI runs as it), and root
            self._sock.setblocking(False)
            self._loop.add_reader(self._sock.fileno(), self._read)
        except BaseException:
            self._sock.close()
            raise

    def _read(self) -> None:
        nudged = False
        while True:
            try:
                self._sock.recv(64)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            nudged = True
        if nudged:  # however many came: one look
            self._wake()

    def close(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def nudge(state_dir: Path) -> bool:
    """The CLI's side: tell the daemon of `state_dir` on this host to look now. False when no
    daemon listens there (then its long poll finds the rows)."""
    path = state_dir / NUDGE_SOCKET
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        try:
            with _address(path) as address:
                sock.sendto(b"", address)
        except OSError:
            return False
    return True
