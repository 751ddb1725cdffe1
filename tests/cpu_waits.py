"""How long processes' threads waited for a CPU while a timed step ran: what a loaded box adds.

Linux counts per thread the time it was runnable but not running (`run_delay`, the second field
of /proc/PID/task/TID/schedstat). A graceful handover's bound (DESIGN.md section 9: < 2 s) is
about what the nodes do, not about the suite's other workers sharing two cores with them: under
CI's load a handover the nodes did in 0.2-0.4 s here measured 2.14 s. The two-node tests
subtract what the nodes' threads waited for a CPU during the step. On a quiet machine that is
about 0 and the bound is the bound; what the code itself waits for (a sleep, a reorder window,
a lock, a socket) is not runnable time, so it is never subtracted. Threads that run side by
side and both wait count twice: an allowance that only grows with the load.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

EVERY_S = 0.02  # a process that exits loses at most this much of its last waits


def waited_s(pid: int) -> float | None:
    """The seconds `pid`'s threads (those alive now) have waited for a CPU; None once gone."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


class CpuWaits:
    """Samples the waits of `pids` from `start()` to `stop()` (which returns their sum)."""

    def __init__(self, *pids: int) -> None:
        self._pids = pids
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="cpu-waits", daemon=True)

    def start(self) -> CpuWaits:
        self._read()
        self._thread.start()
        return self

    def stop(self) -> float:
        self._done.set()
        self._thread.join(5)
        self._read()
        return sum(self._last[pid] - first for pid, first in self._first.items())

    def _sample(self) -> None:
        while not self._done.wait(EVERY_S):
            self._read()

    def _read(self) -> None:
        for pid in self._pids:
            seen = waited_s(pid)
            if seen is not None:
                self._first.setdefault(pid, seen)
                self._last[pid] = max(seen, self._last.get(pid, seen))
