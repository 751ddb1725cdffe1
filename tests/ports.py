"""Ports a test must know before a process listens on them, collision-free across xdist workers.

Binding port 0 and closing the socket hands back a port the kernel may give again to the next
port-0 bind: under pytest-xdist another worker's emulator, receiver or daemon (all bind port 0)
can take it before the process this port was meant for starts. So a known-in-advance port comes
from below the kernel's ephemeral range (`ip_local_port_range`), where no port-0 bind and no
outgoing connection ever lands, and each worker draws from its own slice of that span
(PYTEST_XDIST_WORKER), so two workers never pick the same one. Within a slice the draw starts at
a random place (two test runs on one machine start apart) and never repeats a port it handed out
until the slice wraps; a port something already holds is passed over.

Where a process can bind port 0 and report what it got (the daemon, the emulator, the
receiver), tests do that instead; these are for the rest: a server whose port goes on its
command line, a URL where nothing listens.
"""

from __future__ import annotations

import os
import random
import socket
import threading

# Below the ephemeral range (32768-60999 on Linux by default); the span is split among workers.
_SPAN = 12_000
_LOCK = threading.Lock()
_cursor: dict[str, int] = {}  # "next": where this worker's draw goes on


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice() -> tuple[int, int]:
    """[first, last] of this worker's ports."""
    top = _ephemeral_low() - 1
    bottom = max(1024, top - _SPAN)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker) if worker.isdigit() else 0
    width = (top - bottom + 1) // max(count, 1)
    first = bottom + (index % max(count, 1)) * width
    return first, first + width - 1


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now and that no other worker of this run
    and no port-0 bind will take: for a server that must be told its port, or a dead URL."""
    first, last = _slice()
    width = last - first + 1
    with _LOCK:
        port = _cursor.get("next", -1)
        if not first <= port <= last:
            port = first + random.randrange(width)
        for _ in range(width):
            _cursor["next"] = first if port >= last else port + 1
            if _free(port):
                return port
            port = _cursor["next"]
    raise OSError(f"no free port in 127.0.0.1:{first}-{last}")
