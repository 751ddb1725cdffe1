"""Shared bench helpers: the machine, the daemon subprocess, audit/inbox polling, the result table.

Every figure is measured next to a reference taken in the same run on the same disk, and reported
as a ratio, so a slow CI box and a fast laptop can be compared by the ratio, not the raw number.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from ntfy_intake.store import audit


@dataclass
class Row:
    """One line of the results table."""

    figure: str
    value: str
    reference: str = ""
    ratio: str = ""
    target: str = ""
    verdict: str = ""  # "met" / "missed" / "" (no target)


def ratio(a: float, b: float) -> str:
    return "-" if b == 0 else f"{a / b:.2f}x"


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    value = seconds * 1000
    return f"{value:.3f} ms" if value < 1 else f"{value:.1f} ms"


def render(rows: list[Row]) -> str:
    header = Row("figure", "value", "reference (same run)", "ratio", "target", "verdict")
    table = [header, *rows]
    cols = ["figure", "value", "reference", "ratio", "target", "verdict"]
    widths = {c: max(len(getattr(r, c)) for r in table) for c in cols}
    lines = []
    for i, r in enumerate(table):
        lines.append(
            "| " + " | ".join(getattr(r, c).ljust(widths[c]) for c in cols).rstrip() + " |"
        )
        if i == 0:
            lines.append("|" + "|".join("-" * (widths[c] + 2) for c in cols) + "|")
    return "\n".join(lines)


# -- the machine -----------------------------------------------------------------------------------


def machine(directory: Path) -> dict[str, str]:
    """nproc, arch, python, CPU model, memory and the disk that `directory` lives on."""
    info = {
        "nproc": str(os.cpu_count()),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpu": _cpu_model(),
        "memory": _mem_total(),
        "sqlite": sqlite3.sqlite_version,
    }
    info["disk"] = _disk(directory)
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_total() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "unknown"


def _disk(directory: Path) -> str:
    """Filesystem type and device of the mount holding `directory` (from /proc/mounts)."""
    target = str(directory.resolve())
    best = ("", "unknown", "unknown")
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype, *_ = line.split()
            inside = target == mount or target.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best[0]):
                best = (mount, device, fstype)
    mount, device, fstype = best
    rotational = ""
    name = Path(device).name
    for candidate in (name, name.rstrip("0123456789"), name.rsplit("p", 1)[0]):
        flag = Path(f"/sys/block/{candidate}/queue/rotational")
        if candidate and flag.exists():
            rotational = ", rotational" if flag.read_text().strip() == "1" else ", non-rotational"
            break
    return f"{fstype} on {device} (mounted at {mount}{rotational})"


# -- processes -------------------------------------------------------------------------------------


# Bytecode as in production (the Dockerfile compiles it at build time): the daemon writes and
# reads .pyc files under this prefix even where PYTHONDONTWRITEBYTECODE is set for the shell.
PYCACHE = Path(tempfile.gettempdir()) / "ntfy-intake-bench-pycache"
_warmed = False


def bytecode_env(env: dict[str, str]) -> dict[str, str]:
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def warm_bytecode() -> None:
    """Compile what `ntfy-intake run` imports once, so no figure pays for compiling."""
    global _warmed  # noqa: PLW0603 - once per bench process
    if _warmed:
        return
    code = "import ntfy_intake.cli, ntfy_intake.runtime.daemon, ntfy_intake.runtime.logs, ntfy_intake.settings"
    env = bytecode_env({k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")})
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    _warmed = True


def daemon_env(ntfy_url: str, state_dir: Path, **overrides: str) -> dict[str, str]:
    warm_bytecode()
    env = bytecode_env({k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")})
    env.update(
        {
            "NTFY_INTAKE_NTFY_URL": ntfy_url,
            "NTFY_INTAKE_NTFY_TOPICS": "alerts,backups",
            "NTFY_INTAKE_STATE_DIR": str(state_dir),
            "NTFY_INTAKE_NTFY_KEEPALIVE_INTERVAL": "1s",
            "NTFY_INTAKE_NTFY_REORDER_WINDOW": "300ms",
        }
    )
    env.update({f"NTFY_INTAKE_{k.upper()}": v for k, v in overrides.items()})
    return env


@contextlib.contextmanager
def daemon(
    env: Mapping[str, str], log: Path, *, grace: float = 20.0
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m ntfy_intake run`; SIGTERM then, after `grace` seconds, SIGKILL by pid on the
    way out."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ntfy_intake", "run"],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS) and VmRSS of a live process, in KiB."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(rest.split()[0])
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: object, timeout: float, what: str, interval: float = 0.005) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# -- what the daemon recorded ----------------------------------------------------------------------


class LogWatch:
    """Whether a byte string has appeared in a growing log file (read incrementally)."""

    def __init__(self, path: Path, needle: bytes) -> None:
        self.path = path
        self.needle = needle
        self._offset = 0
        self._found = False

    def seen(self) -> bool:
        if self._found:
            return True
        with contextlib.suppress(OSError), self.path.open("rb") as handle:
            start = max(0, self._offset - len(self.needle))  # a needle split across two reads
            handle.seek(start)
            data = handle.read()
            self._found = self.needle in data
            self._offset = start + len(data)
        return self._found


def proc_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a live process (utime + stime from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class AuditCounter:
    """Counts `event` lines as the audit log grows (complete lines only), remembering ids."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.events = 0
        self.backfills = 0
        self.ids: set[str] = set()
        self._offsets: dict[Path, int] = {}

    def poll(self) -> int:
        for path in audit.log_files(self.directory):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            end = data.rfind(b"\n")
            if end < 0:
                continue
            for raw in data[:end].split(b"\n"):
                if b'"kind":"backfill"' in raw:
                    self.backfills += 1
                if b'"kind":"event"' not in raw:
                    continue
                record = json.loads(raw)
                self.ids.add(record["event_id"])
                self.events += 1
            self._offsets[path] = offset + end + 1
        return self.events


class FileWrites:
    """Blocks until a file in `directory` is written or created (Linux inotify), so a probe that
    waits for an audit line takes no CPU meanwhile: a loop re-reading the files every 0.5 ms
    took it from the daemon and PostgreSQL on a 2-core box (issue 23, fourth round). `wait`
    falls back to sleeping `poll` seconds where inotify is not there (not Linux)."""

    _MODIFY, _MOVED_TO, _CREATE = 0x2, 0x80, 0x100

    def __init__(self, directory: Path, poll: float = 0.0005) -> None:
        self.directory = directory
        self.poll = poll
        self._fd = -1
        self._libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

    def _watching(self) -> bool:
        """Watch the directory once it exists (the daemon makes it at its first line)."""
        if self._fd < 0 and self._libc is not None and self.directory.is_dir():
            fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            mask = self._MODIFY | self._MOVED_TO | self._CREATE
            if fd >= 0 and self._libc.inotify_add_watch(fd, os.fsencode(self.directory), mask) >= 0:
                self._fd = fd
            elif fd >= 0:
                os.close(fd)
        return self._fd >= 0

    def wait(self, timeout: float) -> None:
        """Until the next write in the directory (or `timeout`), then forget what came. Until
        the directory exists and is watched, each wait tries to watch it and sleeps `poll`."""
        if self._fd < 0:
            self._watching()
            time.sleep(min(self.poll, timeout))
            return
        select.select([self._fd], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._fd, 65536):
                pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def inbox_count(state_dir: Path) -> int:
    path = state_dir / "intake.sqlite3"
    if not path.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return int(conn.execute("SELECT count(*) FROM inbox").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
