"""The standby (issue 24): failover time, and what a standby attached costs the leader.

Failover: `drill --standby`'s own machinery (ntfy_intake.testbed.drill_standby.prepared) at the
product's default timing (lease_ttl 8 s, renew_every 2 s unless --ttl / --renew-every), a few
rounds each of a graceful SIGTERM and a kill -9 of the leader under the drill's steady stream
(emulator, reference receiver, two nodes on one PostgreSQL schema). Per kind, p50 / max of
fault -> the lease row written by the new leader, and fault -> the first event it recorded
(drill_standby.py's module doc has the exact definitions). The drill's verdict on those rounds
is printed with them: a failover that is fast but loses an event is no figure.

Event rate: one node leading on PostgreSQL (a single-node cluster: it holds the lease and
fences every write, as any node on PostgreSQL does), recording bursts of N events published
at once to the in-process emulator; rate = N over first publish -> the N-th `event` line in
the leader's audit files (polled every 5 ms). The bursts alternate between the leader alone and
the leader with the second node attached (running, standing by, mirroring the journal to its
own files; started before the burst, caught up and given 3 s to finish starting, stopped
after), on the same server and schema, in the same run, after one burst that warms up and is
not counted. Reported: the median
rate of each, their ratio (target >= 0.90: the standby costs the leader at most 10 % of its
rate), the leader's CPU per event recorded in each, and the standby's CPU per 1,000 events it
mirrored. Both nodes run on this machine, so the standby's CPU competes with the leader's here,
where on two boxes it would not: the pessimistic ratio.

Needs a PostgreSQL server: NTFY_INTAKE_BENCH_DATABASE or NTFY_INTAKE_TEST_DATABASE (a throwaway
one: a schema is made and dropped). Run alone:
    uv run python bench/bench_standby.py [--events 5000] [--bursts 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from _common import AuditCounter, Row, daemon_env, met, proc_cpu_s, ratio, render, wait_for
from bench_replay import DATABASE_ENV, backlog, bench_database
from ntfy_intake.store import db
from ntfy_intake.testbed import drill_standby, drill_store
from ntfy_intake.testbed.drill_standby_report import CRASH_SLACK_S, GRACEFUL_BOUND_S
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

DEFAULT_TTL_S = 8.0  # the product's [cluster] defaults (settings/schema.py)
DEFAULT_RENEW_S = 2.0
TARGET_RATE_RATIO = 0.90
BURST_TIMEOUT_S = 300.0
STANDBY_SETTLE_S = 3.0
SEED = 24


@dataclass
class Failover:
    ttl: float
    renew_every: float
    lease: dict[str, list[float]] = field(default_factory=dict)  # kind -> seconds
    event: dict[str, list[float]] = field(default_factory=dict)
    verdict: str = "-"


def failover(server: str, rounds: int, ttl: float, renew_every: float) -> Failover:
    """`rounds` graceful and `rounds` crash failovers, by the drill (module doc)."""
    found = Failover(ttl, renew_every)
    with drill_standby.prepared(
        database=server,
        rounds=2 * rounds,
        seed=SEED,
        lease_ttl=ttl,
        renew_every=renew_every,
        kinds=("sigterm", "kill9"),
        progress=None,
    ) as drill:
        tally = drill.run()
        table = io.StringIO()
        passed = drill.verdict(table)
    for r in tally.rounds:
        if r.lease_s is not None:
            found.lease.setdefault(r.kind, []).append(r.lease_s)
        if r.event_s is not None:
            found.event.setdefault(r.kind, []).append(r.event_s)
    found.verdict = "PASS" if passed else table.getvalue().strip().splitlines()[-1].strip()
    return found


@dataclass
class Rates:
    events: int
    alone: list[float] = field(default_factory=list)  # events/s per burst
    attached: list[float] = field(default_factory=list)
    cpu_alone: list[float] = field(default_factory=list)  # the leader's us of CPU per event
    cpu_attached: list[float] = field(default_factory=list)
    standby_cpu_s: float = 0.0  # over every burst it was attached for, catch-up included
    mirrored: int = 0
    leader_kept: bool = True  # the same node led every burst
    load: tuple[float, float] = (0.0, 0.0)  # the machine's 1-minute load average, before / after


@contextlib.contextmanager
def node(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """One node (`python -m ntfy_intake run`); SIGTERM, then SIGKILL, by pid on the way out."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ntfy_intake", "run"],
            env=env,
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
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)


def leading(store: drill_store.StoreView) -> str | None:
    row = store.row("SELECT node FROM leadership WHERE id = 1 AND expires_at > now()")
    return None if row is None else str(row[0])


def caught_up(mirror: AuditCounter, recorded: AuditCounter) -> None:
    """Until the standby's files hold every event line the leader's do."""
    wait_for(lambda: mirror.poll() >= recorded.poll(), 120, "the standby's catch-up", 0.05)


def rate(server: str, workdir: Path, events: int, bursts: int) -> Rates:
    """Bursts alternately alone and with the standby attached (module doc)."""
    found = Rates(events)
    rng = random.Random(SEED)
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        _, dsn = stack.enter_context(drill_store.own_schema(server, prefix="bench"))
        store = drill_store.StoreView(db.Dsn(dsn))
        stack.callback(store.close)
        emu = stack.enter_context(
            NtfyEmulator(EmulatorConfig(keepalive_interval=1.0, manager_interval=None)).running()
        )

        def env(name: str) -> dict[str, str]:
            return daemon_env(
                emu.url,
                workdir / name,
                state_database=dsn,
                cluster_node=name,
                cluster_lease_ttl=f"{DEFAULT_TTL_S:g}s",
                cluster_renew_every=f"{DEFAULT_RENEW_S:g}s",
                http_listen="127.0.0.1:0",
            )

        leader = stack.enter_context(node(env("pi"), workdir / "pi.log"))
        wait_for(lambda: leading(store) == "pi", 60, "node pi to lead", interval=0.05)
        emu.wait_for_subscribers(1, timeout=60)
        recorded = AuditCounter(workdir / "pi" / "audit")
        load_before = os.getloadavg()[0]
        for burst in range(1 + 2 * bursts):  # the first one warms up and is not counted
            attached = burst % 2 == 0 and burst > 0
            with contextlib.ExitStack() as standby_stack:
                mirror = AuditCounter(workdir / "nas" / "audit")
                standby = None
                if attached:
                    standby = standby_stack.enter_context(node(env("nas"), workdir / "nas.log"))
                    caught_up(mirror, recorded)
                    time.sleep(STANDBY_SETTLE_S)  # its start-up done: only standing by counts
                    cpu_before, mirrored_before = proc_cpu_s(standby.pid), mirror.events
                base, leader_cpu = recorded.poll(), proc_cpu_s(leader.pid)
                items = backlog(events, rng)
                began = time.monotonic()
                for topic, message, title, priority in items:
                    emu.publish(topic, message, title=title, priority=priority)
                deadline = began + BURST_TIMEOUT_S
                while recorded.poll() < base + events:
                    if leader.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"burst {burst + 1}: not recorded (see pi.log)")
                    time.sleep(0.005)
                took = time.monotonic() - began
                found.leader_kept &= leading(store) == "pi"
                if burst == 0:
                    continue
                (found.attached if attached else found.alone).append(events / took)
                cpu = (proc_cpu_s(leader.pid) - leader_cpu) / events * 1e6
                (found.cpu_attached if attached else found.cpu_alone).append(cpu)
                if standby is not None:
                    caught_up(mirror, recorded)
                    found.standby_cpu_s += proc_cpu_s(standby.pid) - cpu_before
                    found.mirrored += mirror.events - mirrored_before
        found.load = (load_before, os.getloadavg()[0])
    return found


def _p50_max(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f} s"


def failover_rows(result: Failover) -> list[Row]:
    timing = f"lease_ttl {result.ttl:g}s / renew_every {result.renew_every:g}s"
    crash_bound = result.ttl + result.renew_every + CRASH_SLACK_S
    rows = []
    for kind, label, bound, target in (
        ("sigterm", "graceful SIGTERM", GRACEFUL_BOUND_S, f"< {GRACEFUL_BOUND_S:g} s"),
        ("kill9", "kill -9", crash_bound, f"<= {crash_bound:g} s"),
    ):
        leases, events = result.lease.get(kind, []), result.event.get(kind, [])
        worst = max(leases, default=float("inf"))
        ok = worst < bound if kind == "sigterm" else worst <= bound
        rows.append(
            Row(
                f"failover, {label} ({timing}): fault -> new lease, p50 / max (n={len(leases)})",
                _p50_max(leases),
                f"-> first event {_p50_max(events)}",
                "",
                target,
                met(ok),
            )
        )
    rows.append(Row("  the drill's verdict on those rounds", result.verdict))
    return rows


def rate_rows(result: Rates) -> list[Row]:
    alone, attached = statistics.median(result.alone), statistics.median(result.attached)
    n = len(result.attached)
    rows = [
        Row(
            f"leader's event rate with a standby attached ({result.events:,}-event bursts,"
            f" median of {n})",
            f"{attached:,.0f} ev/s",
            f"alone {alone:,.0f} ev/s",
            ratio(attached, alone),
            f">= {TARGET_RATE_RATIO:.2f}x",
            met(attached >= TARGET_RATE_RATIO * alone and result.leader_kept),
        ),
        Row(
            "  every burst, alone / attached",
            " ".join(f"{r:,.0f}" for r in result.alone)
            + " / "
            + " ".join(f"{r:,.0f}" for r in result.attached)
            + " ev/s",
        ),
    ]
    rows.append(
        Row(
            "  leader CPU (user+sys) per event recorded, median",
            f"{statistics.median(result.cpu_attached):.0f} us with the standby",
            f"alone {statistics.median(result.cpu_alone):.0f} us",
            ratio(statistics.median(result.cpu_attached), statistics.median(result.cpu_alone)),
        )
    )
    if result.mirrored:
        rows.append(
            Row(
                "  standby CPU (user+sys) per 1,000 events mirrored",
                f"{result.standby_cpu_s * 1000 / result.mirrored * 1000:.0f} ms",
            )
        )
    rows.append(
        Row(
            "  the machine's load average (1 min), before / after the bursts",
            f"{result.load[0]:.2f} / {result.load[1]:.2f}",
            f"{os.cpu_count()} CPUs",
        )
    )
    if not result.leader_kept:
        rows.append(Row("  the leader lost its lease during a burst", "yes: the rate is void"))
    return rows


def rows(workdir: Path, *, quick: bool) -> list[Row]:
    """Every row (run_all.py): skipped, saying why, without a PostgreSQL server."""
    server = bench_database()
    if server is None:
        why = f"no PostgreSQL server: set {DATABASE_ENV[0]} to a throwaway server's DSN"
        return [Row("standby: failover and the leader's rate", f"- (skipped: {why})")]
    events, bursts, rounds = (1_000, 2, 1) if quick else (5_000, 5, 3)
    found = rate_rows(rate(server, workdir, events, bursts))
    found += failover_rows(failover(server, rounds, DEFAULT_TTL_S, DEFAULT_RENEW_S))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000, help="events per burst")
    parser.add_argument("--bursts", type=int, default=5, help="bursts alone, and attached")
    parser.add_argument("--rounds", type=int, default=3, help="failovers of each kind")
    parser.add_argument("--ttl", type=float, default=DEFAULT_TTL_S, help="lease_ttl, seconds")
    parser.add_argument("--renew-every", type=float, default=DEFAULT_RENEW_S, help="seconds")
    parser.add_argument("--only", choices=("rate", "failover"), default=None)
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    args = parser.parse_args()
    server = bench_database()
    if server is None:
        print(f"bench_standby: set {DATABASE_ENV[0]} to a throwaway server's DSN", file=sys.stderr)
        return 2
    found: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-standby-", dir=args.dir) as tmp:
        if args.only in (None, "rate"):
            found += rate_rows(rate(server, Path(tmp), args.events, args.bursts))
        if args.only in (None, "failover"):
            found += failover_rows(failover(server, args.rounds, args.ttl, args.renew_every))
    print(render(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
