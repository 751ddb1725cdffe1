"""The GIL switch interval while a daemon runs (see Daemon.run; measured in bench/bench_live.py)."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

GIL_SWITCH_INTERVAL_S = 0.001


class ThreadSwitches:
    """The GIL switch interval at GIL_SWITCH_INTERVAL_S while any daemon in this process runs,
    and the interval found before the first one back once the last one stops (daemons in one
    process may stop in any order)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._found = 0.0

    @contextlib.contextmanager
    def fast(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._found = sys.getswitchinterval()
                sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    sys.setswitchinterval(self._found)


_switches = ThreadSwitches()
fast = _switches.fast
