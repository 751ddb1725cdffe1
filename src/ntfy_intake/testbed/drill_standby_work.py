"""`drill --standby`'s faults of the work (DESIGN.md section 11): the leader cannot do its work
while another node can, and must yield. Each node reaches ntfy through a route of its own
(testbed/ntfy_route.py), so one node's route can fail while the other's works.

- `route_cut`: the leader's route is cut (its proxy stopped: connections refused, open ones
  reset) until another node leads;
- `stream_silent`: the leader's route keeps every connection open and forwards what the leader
  sends, but nothing comes back from ntfy, keepalives included (the watchdog's case, then
  reconnects that time out);
- `audit_full`: the leader's audit directory refuses writes: a small tmpfs of its own, filled
  (root mounts one at each node's `audit/` before the node starts); where mounting is refused,
  the leader's RLIMIT_FSIZE (prlimit) just below its current audit file's size (EFBIG, not
  ENOSPC). Its audit append fails and the latch is set.

Each is lifted once another node leads (settled, drill_standby.py), a latched node is restarted
(its latch notice advises exactly that), and the drill waits for the faulted node to be ready
again before the next round. The bound for the work to move is `yield_after + lease_ttl +
renew_every + 5 s`; the drill runs the nodes with a short `cluster.yield_after` and
`cluster.probe_every` (below, or `--yield-after` / `--probe-every`) so a round is short, and a
cool-off of the larger of 10 s and twice `yield_after` (or `--yield-cooloff`).
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from ntfy_intake.runtime.readiness import WORK_NTFY_URL_ENV
from ntfy_intake.settings import schema
from ntfy_intake.store import audit
from ntfy_intake.testbed import full_disk
from ntfy_intake.testbed.drill_store import StoreView
from ntfy_intake.testbed.ntfy_route import NtfyRoute, RouteError

# The drill's timing for the yield: short, so a round is short. The keepalive timeout is the
# drill's 1.5 s (drill_parts) and a reconnect into a silent route gives up 1 s after it, so a
# silence is noticed well within yield_after.
YIELD_AFTER_S = 4.0
PROBE_EVERY_S = 1.0
YIELD_COOLOFF_S = 10.0
AUDIT_TMPFS_SIZE = "64m"  # the whole run's audit lines fit many times over; only filled pages count
READY_AGAIN_PROBES = 5  # a node whose fault was lifted must be ready again within as many probes
FILLER = "drill-filler"  # not an audit file's name: the daemon never reads it


class WorkFaults:
    """The nodes' routes to ntfy and audit directories, and the faults made of them."""

    def __init__(
        self,
        upstream: str,
        names: Sequence[str],
        workdir: Path,
        *,
        audit_full: bool,
        yield_after: float,
        probe_every: float,
        yield_cooloff: float | None = None,
    ) -> None:
        self.upstream = upstream
        self.yield_after = yield_after
        self.probe_every = probe_every
        self.yield_cooloff = yield_cooloff or max(YIELD_COOLOFF_S, 2 * yield_after)
        self.workdir = workdir
        self.routes = {name: NtfyRoute(upstream, name) for name in names}
        self.mounted: list[Path] = []
        self.no_tmpfs: str | None = None  # why the audit directories are not tmpfs
        self._stack = contextlib.ExitStack()
        self._limited: int | None = None  # the pid under RLIMIT_FSIZE
        if audit_full:
            for name in names:
                directory = workdir / name / "audit"
                problem = self._stack.enter_context(
                    full_disk.small_filesystem(directory, AUDIT_TMPFS_SIZE)
                )
                if problem is not None:
                    self.no_tmpfs = problem
                    break
                self.mounted.append(directory)

    def env(self, name: str) -> dict[str, str]:
        """Node `name`'s settings for these faults: its route to ntfy, and the yield's timing
        (only the keys this daemon knows: a key it does not know would stop its start)."""
        # One ntfy behind both routes: one work (the fingerprint names ntfy's own address).
        out = {"NTFY_INTAKE_NTFY_URL": self.routes[name].url, WORK_NTFY_URL_ENV: self.upstream}
        timing = {
            "probe_every": self.probe_every,
            "yield_after": self.yield_after,
            "yield_cooloff": self.yield_cooloff,
        }
        for key, seconds in timing.items():
            if ("cluster", key) in schema.ALL_KEYS:
                out[schema.env_name("cluster", key)] = f"{int(seconds * 1000)}ms"
        return out

    # -- the faults ------------------------------------------------------------------------------

    def inject(self, kind: str, name: str, pid: int | None) -> str:
        """Fault node `name` (process `pid`); what was done, for the round's line."""
        if kind == "route_cut":
            self.routes[name].cut()
            return "route cut"
        if kind == "stream_silent":
            self.routes[name].silence()
            return "stream silent"
        assert kind == "audit_full", kind
        directory = self.workdir / name / "audit"
        if directory in self.mounted:
            written = full_disk.fill(directory / FILLER)
            return f"tmpfs filled ({written // 1024} KiB)"
        files = audit.log_files(directory)
        if pid is None or not files:
            return "no audit file to limit"
        limit = max(1, files[-1].stat().st_size - 1)
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        except (ProcessLookupError, PermissionError) as exc:
            return f"prlimit refused: {exc}"
        self._limited = pid
        return f"RLIMIT_FSIZE {limit} bytes ({self.no_tmpfs})"

    def lift(self, kind: str, name: str) -> None:
        if kind in ("route_cut", "stream_silent"):
            self.routes[name].restore()
            return
        (self.workdir / name / "audit" / FILLER).unlink(missing_ok=True)
        if self._limited is not None:
            unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                resource.prlimit(self._limited, resource.RLIMIT_FSIZE, unlimited)
            self._limited = None

    def await_ready(self, store: StoreView, name: str, *, since: float) -> bool:
        """Until node `name`'s readiness row (`nodes`) says ready in a probe made after `since`
        (the server's clock, epoch seconds): the next round's leader, faulted, must have
        someone to yield to. A schema without readiness rows (a daemon before section 11):
        two probe periods. False when not ready within READY_AGAIN_PROBES probes + 10 s."""
        if store.row("SELECT to_regclass('nodes') IS NOT NULL") != (True,):
            time.sleep(2 * self.probe_every)
            return True
        deadline = time.monotonic() + READY_AGAIN_PROBES * self.probe_every + 10.0
        while time.monotonic() < deadline:
            row = store.row(
                "SELECT ready FROM nodes WHERE node = ? AND seen_at > to_timestamp(?)",
                (name, since),
            )
            if row is not None and row[0] is True:
                return True
            time.sleep(0.1)
        return False

    def describe(self, kind: str) -> str:
        """How the fault is made here, for the verdict table."""
        if kind == "audit_full":
            if self.mounted:
                return f"a {AUDIT_TMPFS_SIZE} tmpfs per audit dir, filled"
            return f"RLIMIT_FSIZE (no tmpfs: {self.no_tmpfs})"
        return "a loopback proxy per node: " + ("stopped" if kind == "route_cut" else "silent")

    def close(self, keep: bool = False) -> None:
        """Every route closed, every tmpfs unmounted (`keep`: its audit files copied out first,
        to `<node>/audit.kept`)."""
        for route in self.routes.values():
            with contextlib.suppress(RouteError):
                route.close()
        if keep:
            for directory in self.mounted:
                (directory / FILLER).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    shutil.copytree(directory, directory.with_name("audit.kept"))
        self._stack.close()
