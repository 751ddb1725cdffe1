"""`ntfy-intake drill --standby`: two nodes on one PostgreSQL, faults against the leader, a verdict.

Two daemons run as real subprocesses (`python -m ntfy_intake run`), nodes `pi` and `nas`, each
with a state directory of its own, on one schema of the drill's own (drill_store.own_schema),
with a short lease (`lease_ttl` 3 s, `renew_every` 1 s unless given), against the bundled
emulator and with the reference receiver as the relay target. While a publisher thread sends a
steady stream plus bursts, the drill works through `--rounds` faults drawn from `--seed`, each
against the node that leads at that moment:

- `kill9`: kill -9 by pid; the killed node is started again once a leader is back;
- `sigstop`: SIGSTOP until the other node has taken the lease (so past the TTL), a little
  longer, then SIGCONT: the old leader must find its deadline passed and stand by;
- `pg_terminate`: pg_terminate_backend of every session of the leader's process;
- `pg_restart`: an immediate restart of the server (`--pg-data DIR` only; both nodes lose
  every session);
- `sigterm`: a graceful stop (exit 0), the lease released; the node is started again;
- `route_cut`, `stream_silent`, `audit_full`: the leader cannot do the work (its route to ntfy
  cut or silent, its audit directory full) while the other node can: it must yield
  (drill_standby_work.py); the fault is lifted once the other node leads, and the faulted node
  must be ready again before the next round.

Each round waits for a leader to be back, settled (`_await_leader`), and measures the failover
time two ways: fault -> the lease row written after the fault (a new term for the process
faults; a renewal or a new term for the database ones, where the leader may well keep its
term), and fault -> the first event recorded after the fault (a journal row of that term). At
the end publishing stops, the leader catches up, every triage request is receipted, both
nodes' audit files must equal the journal (store/audit_mirror.compare), and the verdict is
drill_standby_report.py's; the plan, the nodes and what the drill reads of the cluster are in
drill_standby_parts.py, the faults of the work drill_standby_work.py, the run itself
drill_standby_run.py. Exit 0 only on PASS. See docs/drill.md and docs/standby.md.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from ntfy_intake.rules.lease import check_timing
from ntfy_intake.store import db
from ntfy_intake.testbed import drill_parts, drill_store
from ntfy_intake.testbed.drill_standby_parts import KINDS
from ntfy_intake.testbed.drill_standby_run import LEASE_TTL_S, RENEW_EVERY_S, StandbyDrill
from ntfy_intake.testbed.drill_standby_work import PROBE_EVERY_S, YIELD_AFTER_S

# -- entry points ----------------------------------------------------------------------------------


@contextlib.contextmanager
def prepared(
    *,
    database: str,
    rounds: int = 20,
    seed: int | None = None,
    lease_ttl: float = LEASE_TTL_S,
    renew_every: float = RENEW_EVERY_S,
    pg_data: Path | None = None,
    kinds: Sequence[str] = KINDS,
    keep: bool = False,
    progress: TextIO | None = sys.stderr,
    yield_after: float = YIELD_AFTER_S,
    probe_every: float = PROBE_EVERY_S,
    yield_cooloff: float | None = None,
) -> Iterator[StandbyDrill]:
    """A drill ready to `run` (its schema, emulator, receiver and temp dir exist until the end
    of the block): the CLI's, and the bench's (bench/bench_standby.py, its failover rows)."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if seed is None:
        seed = random.SystemRandom().randrange(1, 1_000_000)
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="ntfy-intake-drill-"))
        if not keep:
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        schema, schema_dsn = stack.enter_context(drill_store.own_schema(database))
        receiver_server = drill_parts.ReceiverServer(workdir / "receiver.sqlite3")
        receiver_server.start()
        stack.callback(receiver_server.stop)
        emu = stack.enter_context(drill_parts.drill_emulator().running())
        standby = StandbyDrill(
            rounds=rounds,
            seed=seed,
            lease_ttl=lease_ttl,
            renew_every=renew_every,
            database=schema_dsn,
            pg_data=pg_data,
            kinds=kinds,
            workdir=workdir,
            emu=emu,
            receiver_server=receiver_server,
            progress=progress,
            yield_after=yield_after,
            probe_every=probe_every,
            yield_cooloff=yield_cooloff,
        )
        stack.callback(standby.store.close)
        stack.callback(standby.work.close, keep)
        standby.tally.kept = keep
        standby.tally.store = f"PostgreSQL {db.Dsn(database)} schema {schema}" + (
            "" if keep else " (dropped after)"
        )
        yield standby


def run(*, out: TextIO = sys.stdout, **options: Any) -> int:
    """Run the standby drill (`prepared`'s options), print the verdict table to `out`; 0 on
    PASS, 1 on FAIL."""
    with prepared(**options) as standby:
        standby.run()
        return 0 if standby.verdict(out) else 1


def main(args: argparse.Namespace) -> int:
    """`ntfy-intake drill --standby`."""
    problem = None
    if args.database is None:
        problem = "--standby needs --database DSN (two nodes share one PostgreSQL)"
    elif args.ntfy_url is not None or args.topic is not None:
        problem = "--standby runs against the bundled emulator (no --ntfy-url / --topic)"
    elif args.rounds < 1:
        problem = "--rounds must be at least 1"
    elif args.pg_data is not None and not args.pg_data.is_dir():
        problem = f"--pg-data {args.pg_data}: no such directory"
    else:
        problem = check_timing(args.lease_ttl, args.renew_every) or _check_kinds(
            args.kinds, args.pg_data
        )
    if problem is None and min(args.yield_after, args.probe_every, args.yield_cooloff or 1) <= 0:
        problem = "--yield-after, --probe-every and --yield-cooloff must be above 0"
    if problem is not None:
        print(f"drill: {problem}", file=sys.stderr)
        return 2
    return run(
        database=args.database,
        rounds=args.rounds,
        seed=args.seed,
        lease_ttl=args.lease_ttl,
        renew_every=args.renew_every,
        pg_data=args.pg_data,
        keep=args.keep,
        kinds=args.kinds.split(",") if args.kinds else KINDS,
        yield_after=args.yield_after,
        probe_every=args.probe_every,
        yield_cooloff=args.yield_cooloff,
        # The streams as they are now: the defaults were bound at import, and a capture that
        # has ended since (a test's, a caller's redirect) would be a closed file.
        out=sys.stdout,
        progress=sys.stderr,
    )


def _check_kinds(kinds: str | None, pg_data: Path | None) -> str | None:
    if kinds is None:
        return None
    unknown = [k for k in kinds.split(",") if k not in KINDS]
    if unknown:
        return f"--kinds: unknown {', '.join(unknown)} (known: {', '.join(KINDS)})"
    if pg_data is None and set(kinds.split(",")) == {"pg_restart"}:
        return "--kinds pg_restart needs --pg-data DIR"
    return None
