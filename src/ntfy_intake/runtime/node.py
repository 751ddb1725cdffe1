"""One node of a cluster on PostgreSQL (DESIGN.md section 9): stand by, lead, stand by again.

A process on PostgreSQL runs this loop (one box on SQLite runs the daemon alone). It holds the
state directory's lock for its whole life, stands by (runtime/standby.py) until it wins a term,
then runs a fresh `Daemon` for that term: recovery before its first decision rebuilds the
cadence from the journal this node mirrored and resumes from the durable cursor and the
backfill owed. A term ends four ways:
- a graceful stop (SIGTERM): the daemon drains under its still-valid term, then this node's
  row says it is not ready (stopped) and the lease is released with a NOTIFY, so a standby
  takes over within a second, even one in a yield's cool-off (runtime/readiness, `leaving`);
- the lease lost (a renewal refused or late, the local deadline passed, a fence that saw a new
  term): the daemon stops its side effects at once, without a drain (its writes would be fenced),
  and the node stands by again, in the same process, with memory rebuilt at its next term;
- a task that failed: exit 1 (systemd restarts the process), the lease released first;
- a yield (DESIGN.md section 11, runtime/yielding.py): the term's work dead or latched while
  another node is ready, the owner's notice recorded under the term, the daemon drains as at
  SIGTERM, its row says it yielded (not ready), the lease is released with a NOTIFY, and the
  node stands by in a cool-off. A term whose audit log latched leaves the node not ready
  until its process restarts (or it leads again: nobody else was ready), whatever ended it.

A standby LISTENs for the release before its first read of the lease (runtime/cluster.py): a
release that came between the two went unheard, and a standby that had just started took
over only at its next poll (2.2 to 2.8 s after a SIGTERM at the default timing). The HTTP
surface's modules are imported off the loop during the first probe for the same reason: that
import held the loop (0.3 s idle, 0.9 s on a busy box) right when a standby starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import structlog

from ntfy_intake.errors import StartupError
from ntfy_intake.flow.database import StorageWaits
from ntfy_intake.rules.yielding import Verdict
from ntfy_intake.runtime import readiness, recovery, yielding
from ntfy_intake.runtime.cluster import Holding, Member, directory_prefix
from ntfy_intake.runtime.recovery import StateLock
from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.runtime.standby import Standby
from ntfy_intake.settings import Settings
from ntfy_intake.settings.schema import Dsn

log = structlog.get_logger("ntfy_intake.cluster")


class Leader(yielding.Working, Protocol):
    """What this loop needs of the daemon it runs for a term (and the yield watch reads)."""

    @property
    def failed(self) -> bool: ...
    async def run(self, stop: asyncio.Event) -> None: ...


class MakeLeader(Protocol):
    """A daemon for one term (the CLI's; tests give their own): `holding` and `state_lock` are
    the Daemon's keyword arguments of those names."""

    def __call__(self, **cluster: Any) -> Leader: ...


async def serve_process(
    settings: Settings, make_leader: MakeLeader, notifier: Notifier, early_stop: threading.Event
) -> int:
    """`ntfy-intake run`: until SIGTERM or SIGINT (one that came during start-up counts), the
    daemon alone on SQLite, or this node's loop on PostgreSQL. The exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if early_stop.is_set():
        stop.set()
    store = settings.state.store
    if isinstance(store, Dsn):
        return await serve(settings, store, make_leader, stop, notifier)
    daemon = make_leader()
    await daemon.run(stop)
    return 1 if daemon.failed else 0


async def serve(
    settings: Settings, dsn: Dsn, make_leader: MakeLeader, stop: asyncio.Event, notifier: Notifier
) -> int:
    """Until `stop`: the exit code (module doc)."""
    lock = StateLock(settings.state.dir / "daemon.lock")
    lock.acquire()
    cluster = settings.cluster
    member = Member(
        dsn,
        node=cluster.node,
        lease_ttl=cluster.lease_ttl,
        renew_every=cluster.renew_every,
        prefix=directory_prefix(settings.state.dir),
        url=cluster.url,
    )
    failed = False
    waits = StorageWaits()
    work = yielding.WorkWatch()  # what this node's row says of its work: the yield rule's view
    prober = readiness.Prober(settings, member, work)  # section 11: could this node do the work?
    # The cool-off asks in the lease thread: the rows read again when the lease is free.
    cooloff = yielding.Cooloff(
        member,
        cooloff=cluster.yield_cooloff,
        peers=prober.campaign_peers,
        refuses=prober.says_not_ready,
    )
    member.hold_off = lambda: prober.hold_off() or cooloff()
    member.readiness_view = prober.view
    probing: asyncio.Task[None] | None = None
    watching: asyncio.Task[None] | None = None
    try:
        # The store first (its migrations hold the lease table): a database still booting is
        # waited out, degraded, and owes the owner one notice, written by the first leader.
        if not await recovery.when_reachable(
            member.prepare, stop, waits, {}, notifier, member.instance
        ):
            return 0
        # The HTTP surface's modules in a thread alongside (module doc), never awaited: the
        # campaign's first claim must not wait for them either.
        asyncio.get_running_loop().run_in_executor(None, _import_surfaces)
        await prober.start(stop)  # a work differing from the leader's: exit 2, naming the keys
        probing = asyncio.create_task(prober.run(stop), name="readiness")
        # One owner notice per database outage longer than the lease, on either side of it.
        outages = recovery.OutageWatch(member, waits, lease_ttl=cluster.lease_ttl)
        watching = asyncio.create_task(outages.run(stop), name="outages")
        while not stop.is_set():
            holding = await Standby(settings, member, notifier).run(stop)
            if holding is None:
                break
            outages.check()  # an outage that just ended (this campaign's first answer) is owed
            holding.owed, waits.notices_owed = waits.notices_owed, []
            leader = make_leader(holding=holding, state_lock=lock)
            prober.lead(leader)
            work.leading(leader)
            watch = functools.partial(
                yielding.watch_term,
                leader,
                holding,
                work=work,
                peers=prober.peers_ready,
                yield_after=cluster.yield_after,
                term_began=time.monotonic(),
                record_within=cluster.lease_ttl,
            )
            failed, yielded = await _lead(leader, member, holding, stop, watch)
            work.leading(None)
            # A term that ended latched (a yield for it, a lost lease, a stop): this process
            # could not do the work, and its row says so from now on (rules/readiness).
            prober.stand_by(latched=leader.journal.latched)
            taken = None if stop.is_set() else await member.name_taken()
            if taken is not None:  # fenced by a second process under this name: exit 2
                raise StartupError(taken)
            if failed or stop.is_set():
                break
            if yielded is not None:
                # Drained under the term: its row says it yielded, then the lease, with its
                # NOTIFY, to the ready node (whose cool-off, if any, no longer counts this one).
                await prober.leaving(f"yielded the work to {yielded.to}")
                await member.release()
                cooloff.began(yielded.to, holding.term)
                log.warning("cluster.yielded", node=member.node, term=holding.term, to=yielded.to)
                notifier.status(f"standby: yielded term {holding.term} to {yielded.to}")
                continue
            log.warning("cluster.stepped_down", node=member.node, term=holding.term)
            notifier.status(f"standby: term {holding.term} is over; standing by")
    finally:
        # No ready peer for anyone from here on, then the lease (module doc).
        await prober.leaving("stopped (a graceful stop)" if not failed else "stopped (failed)")
        await member.release()
        if watching is not None:
            watching.cancel()
        if probing is not None:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
        prober.close()
        member.close()
        lock.release()
    return 1 if failed else 0


def _import_surfaces() -> None:
    """The standby's HTTP surface's modules, imported in a thread (module doc). A failure is
    the standby's own import's to report (the same error, on the loop)."""
    with contextlib.suppress(ImportError):
        from ntfy_intake.surfaces import console, http_api  # noqa: F401, PLC0415


async def _lead(
    leader: Leader,
    member: Member,
    holding: Holding,
    stop: asyncio.Event,
    watch: Callable[[], Coroutine[Any, Any, Verdict]],
) -> tuple[bool, Verdict | None]:
    """One term: True when it ended in a failure (not when the lease was lost); the verdict
    when it ended in a yield (`watch` said so: the daemon stopped as at SIGTERM, and drained)."""
    lead_stop = asyncio.Event()
    keeper = asyncio.create_task(member.hold(holding), name="lease")
    yielded: list[Verdict] = []

    async def until_it_cannot_work() -> None:
        yielded.append(await watch())
        lead_stop.set()

    async def until_stop_or_lost() -> None:
        waits = [asyncio.create_task(stop.wait()), asyncio.create_task(holding.lost.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        lead_stop.set()

    watcher = asyncio.create_task(until_stop_or_lost(), name="lead-stop")
    yielder = asyncio.create_task(until_it_cannot_work(), name="yield-watch")
    try:
        await leader.run(lead_stop)
    finally:
        for task in (watcher, yielder, keeper):
            task.cancel()
        for task in (watcher, yielder, keeper):
            with contextlib.suppress(asyncio.CancelledError):
                await task
    verdict = yielded[0] if yielded else None
    if holding.lost.is_set() and not stop.is_set():
        return False, verdict
    return leader.failed, verdict
