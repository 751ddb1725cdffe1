"""`ntfy-intake drill`: kill -9 the real daemon again and again, then prove nothing was lost or doubled.

The daemon runs as a real subprocess (`python -m ntfy_intake run`, configured through the
environment, its own temporary state directory) against the bundled ntfy-compatible emulator (or
a real ntfy server and test topic), with the reference triage receiver as `relay.url`. A publisher
thread sends a steady stream plus bursts while the drill works through a seeded plan:

- `kill -9` by pid at random moments (some before the restart has even caught up);
- restarts with `NTFY_INTAKE_TEST_CRASH_AT=<point>:<nth>`, so the daemon SIGKILLs itself at each
  named crash point (after the inbox commit, after the audit write, after a relay POST);
- SIGTERM restarts (each must exit 0 after its graceful drain);
- emulator faults: a forced 400 on the cursor (full replay), eviction of cached messages that are
  already recorded, a stream silenced for longer than the keepalive timeout, swapped live order,
  a message delivered twice at subscribe, a scheduled message delivered while the daemon is down
  (its row id sorts before the cursor), cache writes lagging the live publish across a restart;
- a receiver outage (stopped, then back on the same port) and injected 503s.

Recovery time is measured from each restart to the moment every event published before it, and
the first one published after it, have audit lines (backlog done, live again). At the end publishing stops, the daemon catches up (bounded), is stopped with SIGTERM,
and every published id is checked against the audit log, the inbox and the receiver's receipts
(drill_report.py). The parts it drives are in drill_parts.py, its schedule in drill_plan.py.
Exit 0 only on PASS. See docs/drill.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import httpx

from ntfy_intake import settings
from ntfy_intake.errors import ConfigError
from ntfy_intake.store import db
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.drill_args import add_arguments
from ntfy_intake.testbed.drill_parts import (
    CACHE_LAG_S,
    CRASH_BOUND_S,
    DEBOUNCE,
    EMULATOR_PACE,
    EMULATOR_TOPICS,
    EVICT_AGE_S,
    FINAL_BOUND_S,
    KEEPALIVE_INTERVAL,
    KEEPALIVE_TIMEOUT,
    POLL_S,
    RELAY_BOUND_S,
    RELAY_MAX_ATTEMPTS,
    RELAY_TIMEOUT,
    REORDER_WINDOW,
    SCHEDULE_DELAY_S,
    SERVER_PACE,
    SILENCE_S,
    STALL_BOUND_S,
    STOP_BOUND_S,
    AuditTail,
    DaemonProcess,
    Ledger,
    Pace,
    Publisher,
    ReceiverServer,
    Send,
    drill_emulator,
    emulator_sender,
    health_pid,
    read_cursor,
    server_sender,
)
from ntfy_intake.testbed.drill_plan import (
    BEFORE_FAULTS,
    EMULATOR_DURING,
    Phase,
    build_plan,
)
from ntfy_intake.testbed.drill_report import Tally, check, render
from ntfy_intake.testbed.drill_store import StoreView, own_schema
from ntfy_intake.testbed.emulator import NtfyEmulator

# -- the drill -------------------------------------------------------------------------------------


@dataclass
class Target:
    url: str
    topics: tuple[str, ...]
    token: str | None
    emulator: NtfyEmulator | None


class Drill:
    def __init__(
        self,
        *,
        kills: int,
        seed: int,
        duration: float | None,
        target: Target,
        workdir: Path,
        receiver_server: ReceiverServer,
        send: Send,
        pace: Pace,
        progress: TextIO | None,
        database: str | None = None,
    ) -> None:
        self.kills = kills
        self.database = database  # a DSN naming the drill's own schema; None: SQLite
        self.seed = seed
        self.duration = duration
        self.target = target
        self.emu = target.emulator
        self.state_dir = workdir / "state"
        self.receiver = receiver_server
        self.rng = random.Random(seed)
        self.plan = build_plan(kills, self.rng, emulator=self.emu is not None)
        self.ledger = Ledger()
        self.publisher = Publisher(send, target.topics, random.Random(seed + 1), self.ledger, pace)
        self.tail = AuditTail(self.state_dir / "audit")
        self.store = StoreView(db.Dsn(database) if database else self.state_dir / "intake.sqlite3")
        self.daemon = DaemonProcess(self._daemon_env(), workdir / "daemon.log")
        self.progress = progress
        label = (
            f"bundled emulator {target.url} (topics {','.join(target.topics)})"
            if self.emu is not None
            else f"{target.url} (topic {','.join(target.topics)})"
        )
        self.tally = Tally(
            target=label,
            seed=seed,
            kills_requested=kills,
            state_dir=self.state_dir,
            store=self.store.describe(),
        )
        self._fault_log: dict[str, list[str]] = {}
        self.given_up: set[str] = set()  # ids a stalled wait stopped waiting for
        self._started_at = 0.0
        self._scheduled: list[tuple[str, str, float]] = []  # (id, topic, due) not yet delivered
        self._cache_lag = False

    def _daemon_env(self) -> dict[str, str]:
        env = {
            "NTFY_INTAKE_NTFY_URL": self.target.url,
            "NTFY_INTAKE_NTFY_TOPICS": ",".join(self.target.topics),
            "NTFY_INTAKE_STATE_DIR": str(self.state_dir),
            "NTFY_INTAKE_NTFY_REORDER_WINDOW": REORDER_WINDOW,
            "NTFY_INTAKE_RELAY_URL": self.receiver.url,
            "NTFY_INTAKE_RELAY_TIMEOUT": RELAY_TIMEOUT,
            "NTFY_INTAKE_RELAY_MAX_ATTEMPTS": RELAY_MAX_ATTEMPTS,
            "NTFY_INTAKE_CADENCE_DEBOUNCE": DEBOUNCE,
        }
        if self.database:
            env["NTFY_INTAKE_STATE_DATABASE"] = self.database
        if self.emu is not None:
            env["NTFY_INTAKE_NTFY_KEEPALIVE_INTERVAL"] = f"{KEEPALIVE_INTERVAL:g}s"
            env["NTFY_INTAKE_NTFY_KEEPALIVE_TIMEOUT"] = f"{int(KEEPALIVE_TIMEOUT * 1000)}ms"
        if self.target.token:
            env["NTFY_INTAKE_NTFY_TOKEN"] = self.target.token
        return env

    def say(self, text: str) -> None:
        if self.progress is not None:
            print(f"drill: {text}", file=self.progress, flush=True)

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> Tally:
        self._started_at = time.monotonic()
        try:
            for index, phase in enumerate(self.plan):
                self._phase(index, phase)
            self._final()
        finally:
            self.publisher.stop()
            self.daemon.close()
        return self._closing_tally()

    def _closing_tally(self) -> Tally:
        """What was published, how often the daemon started and how long it all took."""
        self._summarise_faults()
        self.tally.published = self.ledger.count()
        self.tally.published_by_topic = Counter(self.ledger.by_topic)
        self.tally.publish_errors = self.ledger.errors
        self.tally.starts = self.daemon.starts
        self.tally.wall_s = time.monotonic() - self._started_at
        return self.tally

    def _phase(self, index: int, phase: Phase) -> None:
        self.say(f"lifetime {index + 1}/{len(self.plan)}: {phase.describe()}")
        self._deliver_scheduled()  # the daemon is down: the worst moment for it
        for fault in phase.before:
            self._arm(fault)
        published = self.ledger.count()
        started = self.daemon.start(phase.crash_at)
        if index == 0:
            self._first_start()
        kill_at = started + phase.early if phase.early is not None else None
        state, took = self._catch_up(published, started, until=kill_at)
        if self._cache_lag and self.emu is not None:
            self.emu.faults.lag_cache_writes(None)  # writes still pending land when due
            self._cache_lag = False
        if state == "caught" and published:
            assert took is not None
            self.tally.recovery.append(took)
        if phase.end == "crash":
            self._await_crash(phase)
            return
        if state == "died":
            self._unexpected_exit(f"start #{self.daemon.starts} ({phase.describe()})")
            return
        if state == "timeout":
            self.tally.stalls.append(
                f"start #{self.daemon.starts}: not caught up {STALL_BOUND_S:g} s after restart"
            )
        if phase.early is not None:
            if kill_at is not None:
                time.sleep(max(0.0, kill_at - time.monotonic()))
            self._kill(early=state != "caught")
            return
        if not self._wait_running():
            return
        for fault in phase.during:
            if self.daemon.alive():
                self._during(fault)
        self._dwell(index)
        if not self.daemon.alive():
            self._unexpected_exit(f"start #{self.daemon.starts} ({phase.describe()})")
            return
        if phase.end == "kill":
            self._kill(early=False)
        else:
            self._sigterm(f"start #{self.daemon.starts}")

    def _wait_running(self) -> bool:
        """Until the daemon's loop runs (its health row carries its pid): only then is a SIGTERM
        a graceful stop rather than the default action during interpreter start-up."""
        deadline = time.monotonic() + STALL_BOUND_S
        while health_pid(self.store) != self.daemon.pid:
            if not self.daemon.alive():
                self._unexpected_exit(f"start #{self.daemon.starts} (starting up)")
                return False
            if time.monotonic() > deadline:
                self.tally.stalls.append(f"start #{self.daemon.starts}: loop not running")
                self.daemon.kill9()
                return False
            time.sleep(0.02)
        return True

    def _first_start(self) -> None:
        """Wait for the first cursor (the join time, persisted at once), then start publishing."""
        deadline = time.monotonic() + STALL_BOUND_S
        while read_cursor(self.store) is None:
            if not self.daemon.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start; see {self.daemon.log_path}")
            time.sleep(0.05)
        if self.emu is not None:
            self.emu.wait_for_subscribers(1, timeout=STALL_BOUND_S)
        self.publisher.start()

    def _catch_up(
        self,
        published: int,
        started: float,
        *,
        until: float | None = None,
        bound: float = 0.0,
        live: bool = True,
    ) -> tuple[Literal["caught", "died", "deadline", "timeout"], float | None]:
        """Wait until the daemon is caught up: every event published before `started` has an
        audit line and, when `live`, so has the first one published after it (the daemon is
        recording the live stream again, not just done with the backlog)."""
        bound = bound or STALL_BOUND_S
        missing = [i for i in self.ledger.ids(published) if i not in self.given_up]
        first_after: str | None = None
        self.tail.poll()
        while True:
            missing = [i for i in missing if not self.tail.counts[i]]
            now = time.monotonic()
            if live and first_after is None and self.ledger.count() > published:
                first_after = self.ledger.ids(published + 1)[-1]
            if not missing and (not live or (first_after and self.tail.counts[first_after])):
                return "caught", now - started
            if not self.daemon.alive():
                return "died", None
            if until is not None and now >= until:
                return "deadline", None
            if now - started > bound:
                # Reported as lost at the end; later waits must not stall on them again.
                self.given_up.update(missing)
                return "timeout", None
            time.sleep(POLL_S)
            while not self.tail.poll() and time.monotonic() - now < 0.25:
                time.sleep(POLL_S)

    def _await_crash(self, phase: Phase) -> None:
        assert phase.crash_at is not None
        point = phase.crash_at.partition(":")[0]
        code = self.daemon.wait_exit(CRASH_BOUND_S)
        if code is None:
            self.daemon.kill9()
            self.tally.crash_not_reached.append(phase.crash_at)
            self.say(f"crash point {phase.crash_at} not reached; killed by pid")
        elif code == -signal.SIGKILL:
            self.tally.crash_kills[point] += 1
        else:
            self._unexpected_exit(f"start #{self.daemon.starts} ({phase.describe()})")

    def _kill(self, *, early: bool) -> None:
        if not self.daemon.alive():
            self._unexpected_exit(f"start #{self.daemon.starts} (before its kill -9)")
            return
        self.daemon.kill9()
        self.tally.random_kills += 1
        self.tally.early_kills += int(early)

    def _sigterm(self, what: str, *, final: bool = False) -> None:
        code = self.daemon.terminate(STOP_BOUND_S)
        if final:
            self.tally.final_stop = "timed out" if code is None else f"exit {code}"
        else:
            self.tally.sigterm_restarts += 1
        if code is None:
            self.tally.sigterm_unclean.append(f"{what}: still running {STOP_BOUND_S:g} s after")
        elif code != 0:
            self.tally.sigterm_unclean.append(f"{what}: exit {code}")

    def _unexpected_exit(self, what: str) -> None:
        code = self.daemon.returncode()
        self.tally.unexpected_exits.append(f"{what}: exit {code}, log {self.daemon.log_path}")
        self.say(f"daemon exited unexpectedly: {what} (exit {code})")

    def _dwell(self, index: int) -> None:
        if self.duration is None:
            time.sleep(self.rng.uniform(0.3, 1.5))
            return
        deadline = self._started_at + self.duration * (index + 1) / len(self.plan)
        time.sleep(max(0.1, deadline - time.monotonic()))

    # -- faults ----------------------------------------------------------------------------------

    def _note(self, fault: str, what: str) -> None:
        self._fault_log.setdefault(fault, []).append(what)

    def _arm(self, fault: str) -> None:
        assert self.emu is not None
        if fault == "force_400":
            self.emu.faults.force_400(1)
            self.tally.expect_fallback_400 = True
            self._note(fault, "armed")
        elif fault == "duplicate_at_subscribe":
            self.emu.faults.duplicate_at_subscribe()
            self._note(fault, "armed")
        elif fault == "cache_lag":
            # Messages published from now until the restart has caught up reach live streams
            # at once but the cache only later: one published before the new stream registers
            # is in neither the live stream nor its replay. The backfill must find it.
            self.emu.faults.lag_cache_writes(CACHE_LAG_S)
            self._cache_lag = True
            self._note(fault, f"writes lag {CACHE_LAG_S:g} s across a restart")

    def _deliver_scheduled(self) -> None:
        """Deliver due scheduled messages now (ntfy's delayed sender), and only now: they count
        as published from this moment."""
        if self.emu is None or not self._scheduled:
            return
        time.sleep(max(0.0, max(due for _, _, due in self._scheduled) - time.monotonic()))
        delivered = set(self.emu.send_delayed())
        for event_id, topic, _ in self._scheduled:
            if event_id in delivered:
                self.ledger.add(event_id, topic)
        self._note("scheduled", f"{len(delivered)} delivered with the daemon down")
        self._scheduled = [s for s in self._scheduled if s[0] not in delivered]

    def _during(self, fault: str) -> None:
        self.say(f"fault: {fault}")
        if fault == "evict":
            self._evict()
        elif fault == "silence":
            self._silence()
        elif fault == "swap_next_live":
            assert self.emu is not None
            self.emu.faults.swap_next_live(0.2)
            self._note(fault, "armed")
        elif fault == "scheduled":
            assert self.emu is not None
            topic = self.target.topics[0]
            event = self.emu.publish(
                topic, "scheduled report", title="scheduled scrub", delay=SCHEDULE_DELAY_S
            )
            due = time.monotonic() + SCHEDULE_DELAY_S + 0.1
            self._scheduled.append((str(event["id"]), topic, due))
        elif fault == "receiver_down":
            down = self.rng.uniform(1.5, 3.0)
            self.receiver.stop()
            time.sleep(down)
            self.receiver.start()
            self._note(fault, f"stopped {down:.1f} s")
        elif fault == "receiver_503":
            self.receiver.faults.fail_next(3, 503)
            self._note(fault, "3 x 503")

    def _evict(self) -> None:
        """Evict cached messages that are already recorded (never the cursor's own message):
        a correct daemon needs none of them again, so nothing may be lost or reported missing."""
        assert self.emu is not None
        self.tail.poll()
        cursor = read_cursor(self.store)
        keep = cursor[1] if cursor is not None else None
        old = self.ledger.published_before(time.monotonic() - EVICT_AGE_S)
        ids = [i for i in old if self.tail.counts[i] and i != keep]
        evicted = self.emu.faults.evict(ids)
        self._note("evict", f"{len(evicted)} recorded ids evicted")

    def _silence(self) -> None:
        assert self.emu is not None
        streams = self.emu.subscriber_count()
        self.emu.faults.silence(True)
        time.sleep(SILENCE_S)
        self.emu.faults.silence(False)
        published, since = self.ledger.count(), time.monotonic()
        state, took = self._catch_up(published, since)
        if state == "caught":
            assert took is not None
            self._note("silence", f"{SILENCE_S:.1f} s silent; caught up {took:.2f} s after")
        elif state == "timeout":
            self.tally.stalls.append(
                f"no catch-up within {STALL_BOUND_S:g} s after a {SILENCE_S:.1f} s silence "
                f"({streams} stream(s) before it)"
            )
            self._note("silence", "STALLED")

    def _summarise_faults(self) -> None:
        names = {
            "force_400": "forced 400 on the cursor (full replay)",
            "duplicate_at_subscribe": "message delivered twice at subscribe",
            "evict": "cache eviction of recorded messages",
            "silence": f"stream silenced > keepalive timeout ({KEEPALIVE_TIMEOUT:g} s)",
            "swap_next_live": "swapped live order",
            "scheduled": "scheduled message delivered while the daemon is down",
            "cache_lag": "cache writes lagging the live publish across a restart",
            "receiver_down": "receiver outage (stopped)",
            "receiver_503": "receiver 503s",
        }
        for fault, label in names.items():
            notes = self._fault_log.get(fault)
            if fault in (*BEFORE_FAULTS, *EMULATOR_DURING) and self.emu is None:
                self.tally.faults[label] = "skipped: needs the bundled emulator"
            elif notes:
                self.tally.faults[label] = f"{len(notes)}x: " + "; ".join(notes)
            else:
                self.tally.faults[label] = "not run"
        if self.emu is not None:
            answered = sum(1 for e in self.emu.subscribe_log if e.get("fault") == "force_400")
            label = names["force_400"]
            self.tally.faults[label] += f" (answered 400: {answered})"
            self.tally.expect_fallback_400 = answered > 0
            self.emu.faults.clear()

    # -- the end ---------------------------------------------------------------------------------

    def _final(self) -> None:
        self.publisher.stop()
        self._deliver_scheduled()
        published = self.ledger.count()
        self.say(f"publishing stopped after {published} events; final catch-up")
        stopped = time.monotonic()
        if not self.daemon.alive():
            self.daemon.start()
        state, _ = self._catch_up(published, stopped, bound=FINAL_BOUND_S, live=False)
        if state == "caught":
            self.tally.catch_up_s = time.monotonic() - stopped
        elif state == "died":
            self._unexpected_exit(f"start #{self.daemon.starts} (final catch-up)")
        else:
            self.tally.stalls.append(f"final catch-up not done within {FINAL_BOUND_S:g} s")
        if self._await_receipts():
            self.tally.receipts_s = time.monotonic() - stopped
        if self.daemon.alive() and self._wait_running():
            self._sigterm("final stop", final=True)

    def _await_receipts(self) -> bool:
        """Until every triage request in the audit log has a receipt (bounded)."""
        deadline = time.monotonic() + RELAY_BOUND_S
        while self.daemon.alive() and time.monotonic() < deadline:
            self.tail.poll()
            got = {r.key for r in receiver.receipts(self.receiver.db_path)}
            if self.tail.keys <= got:
                return True
            time.sleep(0.1)
        return False


# -- entry points ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ntfy-intake-drill-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def run(
    *,
    kills: int = 20,
    seed: int | None = None,
    duration: float | None = None,
    ntfy_url: str | None = None,
    topic: str | None = None,
    token: str | None = None,
    keep: bool = False,
    database: str | None = None,
    out: TextIO = sys.stdout,
    progress: TextIO | None = sys.stderr,
) -> int:
    """Run the drill, print the verdict table to `out`; 0 on PASS, 1 on FAIL."""
    if kills < 0:
        raise ValueError("kills must not be negative")
    if (ntfy_url is None) != (topic is None):
        raise ValueError("ntfy_url and topic go together")
    if seed is None:
        seed = random.SystemRandom().randrange(1, 1_000_000)
    with contextlib.ExitStack() as stack:
        workdir = stack.enter_context(_workdir(keep))
        schema_dsn = None
        if database is not None:
            schema, schema_dsn = stack.enter_context(own_schema(database))
            label = f"{db.Dsn(database)} schema {schema}" + (" (dropped after)" if not keep else "")
        stop_publishing = threading.Event()
        stack.callback(stop_publishing.set)
        receiver_server = ReceiverServer(workdir / "receiver.sqlite3")
        receiver_server.start()
        stack.callback(receiver_server.stop)
        if ntfy_url is None:
            emu = stack.enter_context(drill_emulator(delayed_sender=False).running())
            target = Target(emu.url, EMULATOR_TOPICS, None, emu)
            send, pace = emulator_sender(emu), EMULATOR_PACE
        else:
            assert topic is not None
            client = stack.enter_context(httpx.Client(timeout=10.0))
            url = ntfy_url.rstrip("/")
            target = Target(url, (topic,), token, None)
            send, pace = server_sender(client, url, token, stop_publishing), SERVER_PACE
        drill = Drill(
            kills=kills,
            seed=seed,
            duration=duration,
            target=target,
            workdir=workdir,
            receiver_server=receiver_server,
            send=send,
            pace=pace,
            progress=progress,
            database=schema_dsn,
        )
        stack.callback(drill.store.close)
        if schema_dsn is not None:
            drill.tally.store = f"PostgreSQL {label}"
        tally = drill.run()
        tally.kept = keep
        findings = check(drill.ledger.ids(), drill.state_dir, receiver_server.db_path, drill.store)
        passed = render(tally, findings, out)
        return 0 if passed else 1


def main(args: argparse.Namespace) -> int:
    if args.faults == "standby":
        from ntfy_intake.testbed import drill_standby  # noqa: PLC0415

        return drill_standby.main(args)
    try:
        token = settings.secret_from(
            "--token-file",
            args.token_file,
            "NTFY_INTAKE_NTFY_TOKEN",
            os.environ,
            allow=args.allow_insecure_permissions,
        )
    except ConfigError as exc:
        print(f"drill: {exc}", file=sys.stderr)
        return 2
    if (args.ntfy_url is None) != (args.topic is None):
        print("drill: --ntfy-url and --topic go together", file=sys.stderr)
        return 2
    if args.kills < 0:
        print("drill: --kills must not be negative", file=sys.stderr)
        return 2
    return run(
        kills=args.kills,
        seed=args.seed,
        duration=args.duration,
        ntfy_url=args.ntfy_url,
        topic=args.topic,
        token=token,
        keep=args.keep,
        database=args.database,
        out=sys.stdout,
        progress=sys.stderr,
    )


def _cli(argv: Sequence[str] | None = None) -> int:
    """`python -m ntfy_intake.testbed.drill` works before the CLI wiring exists."""
    parser = argparse.ArgumentParser(prog="ntfy-intake drill", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(_cli())
