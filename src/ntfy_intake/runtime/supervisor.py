"""The daemon's tasks, watched, and the drain on SIGTERM.

A task that dies with an exception stops the daemon with a failure (systemd restarts it; a
restart is the cure for an unexpected bug); one that simply ends (the HTTP surface after failing
to bind) does not. The drain keeps the stream open for one reorder window so the cursor can
settle on an id, makes everything read durable, moves the cursor, then closes the stream; the
senders then get a bounded time to finish what is in flight. A node hands the work over instead
(DESIGN.md section 9: the standby leads within 2 s): no reorder window, its senders 1 s at most,
and no drain past its term's end (a database that stopped answering).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any

import structlog

from ntfy_intake.flow import intake
from ntfy_intake.flow.writer import Writer

log = structlog.get_logger("ntfy_intake.daemon")

STARTUP_GRACE_S = 1.0
STARTUP_CAP_S = 5.0
CATCH_UP_POLL_S = 0.05

SENDERS = ("relay", "owner")
# A node handing over gives its senders this long, not relay.timeout + 1 s: a receiver holding
# a POST open held the lease with it (DESIGN.md section 9: the standby leads within 2 s).
HANDOVER_SENDERS_S = 1.0


class Supervisor:
    """The tasks, by name; `failed` once one died (the daemon then exits non-zero)."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []
        self.failed = False
        self._stop_began: float | None = None  # monotonic: the drain's start
        self._phases: dict[str, float] = {}  # ms from the drain's start to each step's end
        self._handing_over = False  # the drain was a node's (`_hand_over`)

    def _phase(self, name: str) -> None:
        """A stop's step done: its time since the drain began, logged in one line once every
        task ended (`daemon.stop_phases`): where a slow handover's seconds went."""
        if self._stop_began is not None:
            self._phases[name] = round((time.monotonic() - self._stop_began) * 1000, 1)

    def start(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self.tasks.append(task)
        return task

    async def watch(self, stop: asyncio.Event) -> None:
        """Until a stop request, or a task that died (which sets `failed` and `stop`)."""
        stop_wait = asyncio.create_task(stop.wait())
        running = set(self.tasks)
        try:
            while not stop.is_set() and running:
                done, _ = await asyncio.wait(
                    [*running, stop_wait], return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task is stop_wait:
                        continue
                    running.discard(task)
                    if not task.cancelled() and task.exception() is not None:
                        log.error(
                            "daemon.task_failed", task=task.get_name(), error=repr(task.exception())
                        )
                        self.failed = True
                        stop.set()
        finally:
            stop_wait.cancel()

    async def drain(
        self,
        writer: Writer,
        intake_stop: asyncio.Event,
        reader: asyncio.Task[None],
        writing: asyncio.Task[None],
        reorder_window: float | None,
        lost: asyncio.Event | None = None,
    ) -> None:
        """Graceful stop (module doc). After a failure there is nothing to drain into: close
        the stream and leave the rest to replay. `reorder_window` None: a node handing the work
        over (`_hand_over`), until its term is `lost` at the latest (module doc)."""
        self._stop_began = time.monotonic()
        writer.stopping()
        if self.failed or writing.done():
            intake_stop.set()
            with contextlib.suppress(Exception):
                await reader
            return
        if reorder_window is None:
            self._handing_over = True
            await _unless_lost(self._hand_over(writer, intake_stop, reader), lost)
            return
        # Frames already read but not yet durable count too: wait for the writer first, so a
        # stop right after the audit line is written still waits out their window.
        await writer.wait_idle()
        self._phase("caught_up")
        if writer.resume.oldest_read_at is not None and not reader.done():
            await asyncio.sleep(reorder_window)
        await writer.wait_idle()
        await writer.settle_cursor(at_once=True)
        intake_stop.set()
        with contextlib.suppress(Exception):
            await reader
        await writer.wait_idle()
        self._phase("drained")

    async def _hand_over(
        self, writer: Writer, intake_stop: asyncio.Event, reader: asyncio.Task[None]
    ) -> None:
        """A node's drain (DESIGN.md section 9: the standby leads within 2 s): the cursor over
        every event durable now, window or not, then the stream closed, then what it had read
        committed under the still-valid term. No reorder window is waited out (5 s by default:
        most of the 5.3 s a handover took under a steady stream), and the writer is not waited
        for while the stream still feeds it (under a steady stream its queue is rarely empty:
        1.4 to 1.8 s more). The next leader resumes from that cursor with its overlap backfill
        (at least the window + 10 s), which catches what a reorder would have delivered late;
        what was committed after the cursor is read again there, a duplicate the inbox absorbs.
        The batch being recorded is waited for (one commit): a stop right after its audit line
        left the cursor before it, the join time after a first start, and the next leader then
        resumed by time, with no gap probe after a cache loss."""
        await writer.batch_done()
        await writer.settle_cursor(at_once=True, whole=True)
        self._phase("cursor")
        intake_stop.set()
        with contextlib.suppress(Exception):
            await reader
        self._phase("stream_closed")
        await writer.wait_idle()
        self._phase("drained")

    async def let_senders_finish(self, within: float) -> None:
        """In-flight deliveries finish (bounded by `within` seconds) or stay leased, which the next
        start releases: never marked delivered without a 2xx. A node handing over (its drain
        was `_hand_over`) waits HANDOVER_SENDERS_S at most: what is still in flight then is
        sent again by the next leader under its own key (receivers deduplicate), as after a
        crash, instead of holding the lease while a receiver holds its answer."""
        if self._handing_over:
            within = min(within, HANDOVER_SENDERS_S)
        senders = [t for t in self.tasks if t.get_name() in SENDERS]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(asyncio.shield(t) for t in senders), return_exceptions=True),
                timeout=within,
            )
        self._phase("senders")

    async def cancel_the_rest(self, *, spare: str) -> None:
        """Cancel every task but intake (ended by the drain) and `spare` (which stops on its own
        event), then await them all."""
        for task in self.tasks[1:]:
            if task.get_name() != spare:
                task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self._phase("tasks_ended")
        if self._phases:
            log.info("daemon.stop_phases", **self._phases)

    async def abandon(self) -> None:
        """A term that is over (DESIGN.md section 9): every task cancelled at once, nothing
        drained (a POST in flight may repeat under its stable key at the next leader)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        log.warning("daemon.stepped_down", tasks=len(self.tasks))


async def _unless_lost(drain: Coroutine[Any, Any, None], lost: asyncio.Event | None) -> None:
    """`drain`, given up once `lost` is set: a term that ended mid-drain (its local deadline
    passed while the database did not answer) may write nothing more, and the drain would have
    waited for the database as long as the outage lasted, its process deaf to SIGTERM until
    systemd killed it. What it had read is the next leader's, through its overlap backfill."""
    work = asyncio.ensure_future(drain)
    if lost is None:
        await work
        return
    ended = asyncio.create_task(lost.wait())
    try:
        await asyncio.wait([work, ended], return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
    if work.done():
        work.result()
        return
    log.warning("daemon.drain_abandoned", reason="the term ended mid-drain")
    work.cancel()  # a database call in its thread ends first (Database.run)
    with contextlib.suppress(asyncio.CancelledError):
        await work


async def after_subscribing(
    subscribed: asyncio.Event, queue: asyncio.Queue[intake.Item], stop: asyncio.Event | None = None
) -> None:
    """What intake does not need (the HTTP surface, the scheduler) loads once the first
    subscription is on its way and the writer has caught up with what it replays (its queue
    found empty twice, CATCH_UP_POLL_S apart), or STARTUP_CAP_S after start at the latest: a
    start never waits for starlette, and a backlog is not slowed by its imports. At once when
    `stop` is set: a SIGTERM during start-up waited out the grace (no subscription comes) and
    the imports before the lease could be handed over (1.5 s of a 1.7 s handover)."""
    cap = time.monotonic() + STARTUP_CAP_S
    stopped = stop or asyncio.Event()
    waits = [asyncio.create_task(subscribed.wait()), asyncio.create_task(stopped.wait())]
    try:
        await asyncio.wait(waits, timeout=STARTUP_GRACE_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    idle = 0
    while idle < 2 and time.monotonic() < cap and not stopped.is_set():
        await asyncio.sleep(CATCH_UP_POLL_S)
        idle = idle + 1 if queue.empty() else 0
