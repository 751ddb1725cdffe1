"""The systemd notify protocol: READY, STATUS, WATCHDOG and STOPPING datagrams to `$NOTIFY_SOCKET`.

Why hand-written: the protocol is one `AF_UNIX`/`SOCK_DGRAM` datagram of newline-separated
`KEY=value` fields (sd_notify(3)), about forty lines. The python-systemd binding needs the
libsystemd headers and a compiler at install time, which the slim Docker image and a pipx/uv
install on a Pi would otherwise not need, and the pure-Python packages on PyPI add a dependency
for the same forty lines.

Invariants owned here:
- nothing in this module raises to the caller: a failed send returns False and leaves the reason
  in `Notifier.last_error`, so a missing or full socket can never crash the daemon;
- one call is one datagram, and a field can never smuggle in another field (a field holding a
  newline is refused, and `status()` text is flattened to one printable line);
- a send never blocks the event loop for long: the socket has a short timeout.

Without `NOTIFY_SOCKET` (a terminal, Docker, tests) `Notifier.from_environ` returns a disabled
notifier whose methods send nothing and return False; callers that care check `enabled`.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from ntfy_intake.rules import sanitize

SEND_TIMEOUT_S = 1.0
STATUS_MAX_CHARS = 400


class Notifier:
    """Sends notify datagrams to one socket address, or nothing when disabled.

    `address` is a filesystem path ("/run/systemd/notify") or an abstract-namespace name given
    as systemd writes it ("@name"); None disables the notifier.
    """

    def __init__(self, address: str | None, *, timeout: float = SEND_TIMEOUT_S) -> None:
        self.address = address
        self.timeout = timeout
        self.last_error: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Notifier:
        """Read `NOTIFY_SOCKET`. Unset, empty or a scheme we do not speak (vsock:) disables it."""
        raw = environ.get("NOTIFY_SOCKET", "")
        if raw.startswith(("/", "@")) and len(raw) > 1:
            return cls(raw)
        return cls(None)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """Send `fields` ("KEY=value" each) as one datagram. True when the socket accepted it."""
        if self.address is None:
            return False
        if not fields:
            return self._fail("no fields to send")
        for field in fields:
            key, sep, _ = field.partition("=")
            if not sep or not key or "\n" in field:
                return self._fail(f"malformed notify field {field!r}")
        payload = "\n".join(fields).encode("utf-8", errors="replace")
        # systemd writes abstract addresses with a leading "@"; the kernel wants a NUL byte.
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.settimeout(self.timeout)
                sock.sendto(payload, target)
        except OSError as exc:  # missing socket, refused, queue full past the timeout, ...
            return self._fail(f"notify send to {self.address} failed: {exc}")
        self.last_error = None
        return True

    def ready(self, status: str | None = None) -> bool:
        """READY=1: local recovery is done (not: ntfy answered). Optionally with a STATUS line."""
        return self.send("READY=1", *_status_fields(status))

    def status(self, text: str) -> bool:
        """STATUS=<text flattened to one printable line>."""
        return self.send(f"STATUS={one_line(text)}")

    def watchdog(self) -> bool:
        """WATCHDOG=1: the intake loop is making progress (see `watchdog.should_ping`)."""
        return self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1: a graceful drain has begun."""
        return self.send("STOPPING=1", *_status_fields(status))

    def _fail(self, reason: str) -> bool:
        self.last_error = reason
        return False


def one_line(text: str) -> str:
    """STATUS= text: the shared sanitizer's one-line form (ANSI sequences and control characters
    stripped, whitespace collapsed), capped."""
    return sanitize.one_line(text, STATUS_MAX_CHARS)


def _status_fields(status: str | None) -> tuple[str, ...]:
    return () if status is None else (f"STATUS={one_line(status)}",)


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of `WATCHDOG_USEC`, as sd_watchdog_enabled(3)
    advises. None when the watchdog is off, the value is not a positive integer, or
    `WATCHDOG_PID` is set and names another process (the variables were inherited)."""
    watchdog_pid = environ.get("WATCHDOG_PID")
    if watchdog_pid is not None and _positive_int(watchdog_pid) != pid:
        return None
    usec = _positive_int(environ.get("WATCHDOG_USEC", ""))
    if usec is None:
        return None
    return usec / 2 / 1_000_000


def _positive_int(text: str) -> int | None:
    # ASCII digits only: str.isdigit() also accepts "²", which int() then rejects.
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value > 0 else None
