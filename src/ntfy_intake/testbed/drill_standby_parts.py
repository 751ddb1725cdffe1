"""`drill --standby`'s parts: the fault plan, a node (its process and log), and what the drill
reads of the cluster while it runs: the lease row, the journal as it grows, each fault's moment
and each round's outcome. The run is drill_standby.py, the verdict drill_standby_report.py."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ntfy_intake.testbed import drill_parts
from ntfy_intake.testbed.drill_store import StoreView

LEASE_KINDS = ("kill9", "sigstop", "pg_terminate", "pg_restart", "sigterm")
PROCESS_FAULTS = ("kill9", "sigstop", "sigterm")  # the leader's process: a new term must follow
# The leader cannot do the work, another node can: it must yield, a new term must follow
# (DESIGN.md section 11; drill_standby_work.py).
WORK_FAULTS = ("route_cut", "audit_full", "stream_silent")
KINDS = (*LEASE_KINDS, *WORK_FAULTS)
LABELS = {
    "kill9": "kill -9",
    "sigstop": "SIGSTOP past the TTL",
    "pg_terminate": "pg_terminate_backend",
    "pg_restart": "PostgreSQL restart",
    "sigterm": "SIGTERM (graceful)",
    "route_cut": "route to ntfy cut",
    "audit_full": "audit directory full",
    "stream_silent": "ntfy stream silent, connection open",
}
JOURNAL_PAGE = 2000
HANDOVER_NOTICES = ("takeover", "yielded")  # rules/notices.py: one of them per term taken


def build_plan(
    rounds: int, rng: random.Random, *, pg_restart: bool, kinds: Sequence[str] = KINDS
) -> list[str]:
    """`rounds` fault kinds (of `kinds`; the restart only with `pg_restart`), each as often as
    the others (to one), in a seeded order."""
    kinds = [k for k in kinds if pg_restart or k != "pg_restart"]
    plan: list[str] = []
    while len(plan) < rounds:
        batch = list(kinds)
        rng.shuffle(batch)
        plan += batch
    return plan[:rounds]


class Node:
    """One node: its daemon process, its state directory, its log (read from a mark on)."""

    def __init__(self, name: str, env: dict[str, str], workdir: Path) -> None:
        self.name = name
        self.state_dir = workdir / name
        self.process = drill_parts.DaemonProcess(
            {**env, "NTFY_INTAKE_STATE_DIR": str(self.state_dir)}, workdir / f"{name}.log"
        )
        self.started_at = 0  # the log's size when this process was started
        self._scanned: dict[tuple[str, int], int] = {}
        self._found: dict[tuple[str, int], bool] = {}

    def start(self) -> None:
        self.started_at = self.mark()
        self.process.start()

    def mark(self) -> int:
        try:
            return self.process.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def said(self, event: str, since: int | None = None) -> bool:
        """Whether the log has a line of `event` after `since` (default: this process's start).
        Each call reads only what the log gained since the last call for the same question."""
        offset = self.started_at if since is None else since
        needle = f'"event": "{event}"'.encode()
        question = (event, offset)
        if self._found.get(question) is True:
            return True
        start = max(offset, self._scanned.get(question, offset) - len(needle))
        try:
            with self.process.log_path.open("rb") as handle:
                handle.seek(start)
                text = handle.read()
        except FileNotFoundError:
            return False
        self._scanned[question] = start + len(text)
        self._found[question] = needle in text
        return self._found[question]

    def ready(self) -> bool:
        """Its loop runs: it stands by or leads."""
        return self.said("standby.status") or self.said("cluster.leading")


# -- what the drill reads of the cluster -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lease:
    node: str
    term: int
    expires_at: float  # the server's clock, epoch seconds: compared with other reads only
    remaining: float

    @property
    def fresh(self) -> bool:
        return self.remaining > 0


class Cluster:
    """The leadership row, read; every term it was seen with and its node."""

    def __init__(self, store: StoreView) -> None:
        self.store = store
        self.terms: dict[int, str] = {}

    def lease(self) -> Lease | None:
        row = self.store.row(
            "SELECT node, term, EXTRACT(EPOCH FROM expires_at)::float8,"
            " EXTRACT(EPOCH FROM expires_at - now())::float8 FROM leadership WHERE id = 1"
        )
        if row is None:
            return None
        lease = Lease(str(row[0]), int(str(row[1])), float(str(row[2])), float(str(row[3])))
        self.seen(lease)
        return lease

    def server_now(self) -> float:
        """The server's clock (epoch seconds), to compare with the lease row's times."""
        row = self.store.row("SELECT EXTRACT(EPOCH FROM now())::float8")
        return float(str(row[0])) if row else 0.0

    def seen(self, lease: Lease | None) -> None:
        if lease is not None:
            self.terms.setdefault(lease.term, lease.node)


@dataclass(frozen=True, slots=True)
class Row:
    """One journal row as the drill keeps it."""

    seq: int
    term: int
    kind: str
    event_id: str | None
    delivery_key: str | None
    notice: dict[str, str] | None  # a takeover notice's fields
    ts: float  # the record's own time (epoch seconds, ms resolution)
    seen: float  # monotonic: when the drill first read it


class Journal:
    """The journal table, followed in seq order as it grows."""

    def __init__(self, store: StoreView) -> None:
        self.store = store
        self.rows: list[Row] = []
        self.keys: set[str] = set()
        self._events: Counter[str] = Counter()

    @property
    def last_seq(self) -> int:
        return self.rows[-1].seq if self.rows else 0

    def poll(self) -> int:
        """Read the rows committed since the last poll; how many (0 when none or unreadable)."""
        added = 0
        while True:
            rows = self.store.rows(
                "SELECT seq, term, line FROM audit_journal WHERE seq > ? ORDER BY seq LIMIT ?",
                (self.last_seq, JOURNAL_PAGE),
            )
            if not rows:
                return added
            now = time.monotonic()
            for seq, term, line in rows:
                self._add(int(str(seq)), int(str(term)), str(line), now)
            added += len(rows)
            if len(rows) < JOURNAL_PAGE:
                return added

    def _add(self, seq: int, term: int, line: str, seen: float) -> None:
        record = json.loads(line)
        kind = str(record.get("kind"))
        event_id = str(record["event_id"]) if kind == "event" else None
        key = record.get("delivery_key") if kind == "event" else None
        notice = None
        if kind == "notice" and record.get("notice") in HANDOVER_NOTICES:
            notice = {k: str(v) for k, v in record.items()}
        ts = _epoch(record.get("ts"))
        self.rows.append(Row(seq, term, kind, event_id, key and str(key), notice, ts, seen))
        if event_id is not None:
            self._events[event_id] += 1
        if key:
            self.keys.add(str(key))

    def event_ids(self) -> set[str]:
        return set(self._events)

    def first_event(self, *, after: int, wall: float, term: int) -> Row | None:
        """The first event row above seq `after`, made at or after `wall`, of `term` or later."""
        for row in reversed(self.rows):
            if row.seq <= after:
                break
        else:
            row = None
        start = 0 if row is None else self.rows.index(row) + 1
        for candidate in self.rows[start:]:
            if (
                candidate.kind == "event"
                and candidate.term >= term
                and candidate.ts >= wall - 0.001
            ):
                return candidate
        return None

    def older_term_rows(self) -> list[int]:
        """Seqs of rows whose term is below a term an earlier row already had."""
        highest, out = 0, []
        for row in self.rows:
            if row.term < highest:
                out.append(row.seq)
            highest = max(highest, row.term)
        return out

    def takeovers(self) -> Counter[int]:
        """Hand-over notices per term taken: a takeover's (recorded under the term taken), or a
        yield's (recorded by the yielder under its own term, for the next: the same key, so the
        next leader's takeover notice is then a no-op and the owner hears once)."""
        return Counter(handover_term(r.notice, r.term) for r in self.rows if r.notice)


def handover_term(notice: dict[str, str], term: int) -> int:
    """The term a hand-over notice (a journal row of `term`) is about."""
    if notice.get("notice") == "yielded":
        return int(notice.get("previous_term", term)) + 1
    return int(notice.get("term", term))


def _epoch(value: object) -> float:
    if not isinstance(value, str):
        return 0.0
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return 0.0


# -- what the drill counted ------------------------------------------------------------------------


@dataclass
class Fault:
    """The moment of one fault, on each clock the drill compares with."""

    top: int  # the journal's highest seq just before it
    server_at: float  # the server's now() just before it
    wall: float  # time.time() just before it (the journal lines' "ts" clock)
    started: float = 0.0  # time.monotonic() just before it


@dataclass
class Round:
    index: int
    kind: str
    target: str  # the node that led at the fault
    term_before: int
    lease_s: float | None = None  # fault -> the lease written after the fault
    event_s: float | None = None  # fault -> the first event recorded after it
    term_after: int | None = None
    leader_after: str | None = None
    stalled: bool = False
    exit_code: int | None = None  # sigterm: the old leader's exit
    stood_by: bool | None = None  # sigstop: the old leader stood by after SIGCONT
    resumed_mark: int = 0  # sigstop: the old leader's log size at SIGCONT
    sessions: int = 0  # pg_terminate: sessions ended
    server_back_s: float | None = None  # pg_restart: pg_ctl restart took
    fault_mark: int = 0  # the faulted node's log size at the fault
    detail: str = ""  # a work fault: what was done
    latched: bool | None = None  # a work fault: the faulted node's audit latch was set
    retook: bool = False  # a work fault: the faulted node took a new term itself meanwhile
    # (term, node) of each lease seen after the fault, in order: what a take-back came after
    # (straight back, or after the other node's term lapsed).
    terms: list[tuple[int, str]] = field(default_factory=list)
    ready_again_s: float | None = None  # a work fault: lifted -> the faulted node ready again

    @property
    def failover(self) -> bool:
        """Another node took a new term."""
        return (
            self.term_after is not None
            and self.term_after > self.term_before
            and self.leader_after != self.target
        )

    @property
    def outcome(self) -> str:
        if self.term_after is None:
            return "no leader"
        if self.failover:
            return f"{self.leader_after} took term {self.term_after}"
        if self.term_after > self.term_before:
            return f"{self.target} took a new term {self.term_after}"
        return f"{self.target} kept term {self.term_after}"

    def describe(self) -> str:
        lease = "-" if self.lease_s is None else f"{self.lease_s:.2f} s"
        event = "-" if self.event_s is None else f"{self.event_s:.2f} s"
        detail = f" ({self.detail})" if self.detail else ""
        back = ""
        if self.retook:
            seen = " -> ".join(f"{node} {term}" for term, node in self.terms)
            back = f"; {self.target} took the lease back itself (terms after the fault: {seen})"
        return (
            f"{LABELS[self.kind]}{detail} of {self.target} (term {self.term_before}):"
            f" {self.outcome}; lease {lease}, first event {event}{back}"
        )
