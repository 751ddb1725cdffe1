"""`drill --standby`'s tally and verdict table (the run is drill_standby.py, what it reads of the
cluster drill_standby_parts.py), in the kill drill's style (drill_report.py, whose check of one
state dir it makes of each node's).

PASS only when: nothing lost or doubled in either node's audit files, every published id has
an inbox row, every triage request was receipted once as an effect and audited as delivered
once, no journal row of an older term follows a newer term's first, one takeover notice per
term taken from another node, both nodes' audit files equal the journal, every round had a
leader back within its bound (graceful < 2 s; a fault of the work, which the leader must yield,
yield_after + lease_ttl + renew_every + 5 s; otherwise lease_ttl + renew_every + 5 s, for the
lease and for the first event recorded), every SIGTERM stop was clean, every old leader stood by
after SIGCONT, every node faulted in its work was ready again after, and no node exited on its
own.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ntfy_intake.testbed import drill_report
from ntfy_intake.testbed.drill_standby_parts import (
    LABELS,
    WORK_FAULTS,
    Journal,
    Round,
    handover_term,
)
from ntfy_intake.testbed.drill_store import StoreView

GRACEFUL_BOUND_S = 2.0
CRASH_SLACK_S = 5.0


@dataclass
class StandbyTally:
    seed: int
    rounds_requested: int
    lease_ttl: float
    renew_every: float
    target: str
    state_dirs: list[Path]
    pg_restart: bool
    store: str = "-"
    kept: bool = False
    published: int = 0
    published_by_topic: dict[str, int] = field(default_factory=dict)
    publish_errors: int = 0
    rounds: list[Round] = field(default_factory=list)
    starts: dict[str, int] = field(default_factory=dict)
    final_stops: dict[str, int | None] = field(default_factory=dict)
    unexpected_exits: list[str] = field(default_factory=list)
    stalls: list[str] = field(default_factory=list)
    terms: dict[int, str] = field(default_factory=dict)  # every term the lease row showed
    mirrors: dict[str, str | None] = field(default_factory=dict)  # node -> mismatch text
    mirror_floor: int = 0
    catch_up_s: float | None = None
    receipts_s: float | None = None
    mirrors_s: float | None = None
    wall_s: float = 0.0
    yield_after: float = 0.0
    probe_every: float = 0.0
    work_how: dict[str, str] = field(default_factory=dict)  # work fault -> how it is made

    @property
    def crash_bound(self) -> float:
        return self.lease_ttl + self.renew_every + CRASH_SLACK_S

    @property
    def yield_bound(self) -> float:
        """A fault of the work: the leader yields after yield_after, then as a crash at most."""
        return self.yield_after + self.crash_bound

    def bound(self, kind: str) -> float:
        if kind in WORK_FAULTS:
            return self.yield_bound
        return GRACEFUL_BOUND_S if kind == "sigterm" else self.crash_bound

    def late(self, r: Round) -> bool:
        """Over its bound: the lease (graceful: strictly under 2 s) or the first event."""
        if r.lease_s is None or r.event_s is None:
            return True
        if r.kind == "sigterm":
            return r.lease_s >= GRACEFUL_BOUND_S or r.event_s > self.crash_bound
        bound = self.bound(r.kind)
        return r.lease_s > bound or r.event_s > bound

    def bound_text(self, kind: str) -> str:
        if kind == "sigterm":
            return f"< {GRACEFUL_BOUND_S:g} s, events <= {self.crash_bound:g} s"
        if kind in WORK_FAULTS:
            return (
                f"<= {self.yield_bound:g} s = yield_after {self.yield_after:g} + lease_ttl"
                f" {self.lease_ttl:g} + renew_every {self.renew_every:g} + {CRASH_SLACK_S:g}"
            )
        return f"<= {self.crash_bound:g} s"


# -- the verdict -----------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _p50_max(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f} s"


def render(
    tally: StandbyTally,
    journal: Journal,
    published: Sequence[str],
    receiver_db: Path,
    store: StoreView,
    out: TextIO,
) -> bool:
    """Print the verdict table; True on PASS."""
    names = [d.name for d in tally.state_dirs]
    found = {d.name: drill_report.check(published, d, receiver_db, store) for d in tally.state_dirs}
    first = found[names[0]]
    rows: list[tuple[str, str, str]] = []
    why: list[str] = []

    def row(label: str, value: object, bad: bool | None = None, reason: str = "") -> None:
        rows.append((label, str(value), "" if bad is None else ("FAIL" if bad else "ok")))
        if bad:
            why.append(reason or label)

    def per_node(values: dict[str, int]) -> str:
        return " / ".join(str(values[n]) for n in names)

    topics = ", ".join(f"{t} {n}" for t, n in sorted(tally.published_by_topic.items()))
    row("events published", f"{tally.published} ({topics})" if topics else tally.published)
    if tally.publish_errors:
        row("publish errors", tally.publish_errors)
    row("events recorded (journal, distinct ids)", len(journal.event_ids()))
    kinds = Counter(r.kind for r in tally.rounds)
    order = [k for k in LABELS if k in kinds]
    row(
        "fault rounds",
        f"{len(tally.rounds)} of {tally.rounds_requested} ("
        + ", ".join(f"{LABELS[k]} {kinds[k]}" for k in order)
        + ")",
        len(tally.rounds) != tally.rounds_requested,
        "a round found no leader to fault",
    )
    if not tally.pg_restart:
        row("PostgreSQL restart", "skipped: needs --pg-data DIR (the server's data dir)")
    failovers = Counter(r.kind for r in tally.rounds if r.failover)
    row(
        "failovers (another node took a new term)",
        f"{sum(failovers.values())} ("
        + ", ".join(f"{LABELS[k]} {failovers[k]}/{kinds[k]}" for k in order)
        + ")",
        any(failovers[k] != kinds[k] for k in ("kill9", "sigstop", "sigterm", *WORK_FAULTS)),
        "a process or work fault of the leader without a failover",
    )
    for kind in ("pg_terminate", "pg_restart"):
        mine = [r for r in tally.rounds if r.kind == kind and not r.failover]
        if mine:
            same = sum(1 for r in mine if r.term_after == r.term_before)
            row(
                f"  {LABELS[kind]}: leader kept its term / took a new one",
                f"{same} / {len(mine) - same}",
            )
    for kind in order:
        mine = [r for r in tally.rounds if r.kind == kind]
        leases = [r.lease_s for r in mine if r.lease_s is not None]
        events = [r.event_s for r in mine if r.event_s is not None]
        late = [r for r in mine if tally.late(r)]
        row(
            f"failover time, {LABELS[kind]} (p50 / max)",
            f"lease {_p50_max(leases)}, first event {_p50_max(events)} (n={len(mine)};"
            f" bound {tally.bound_text(kind)})",
            bool(late),
            f"{len(late)} {LABELS[kind]} round(s) over the bound",
        )
    work = [r for r in tally.rounds if r.kind in WORK_FAULTS]
    if work:
        back = [r for r in work if r.retook]
        row(
            "work faults: the faulted node took the lease back itself",
            len(back)
            if not back
            else f"{len(back)} (rounds {', '.join(str(r.index + 1) for r in back)})",
            bool(back),
            "a node that could not do the work took it back (no hand-over, or a ping-pong)",
        )
    for kind in (k for k in WORK_FAULTS if kinds[k]):
        mine = [r for r in tally.rounds if r.kind == kind]
        again = [r.ready_again_s for r in mine if r.ready_again_s is not None]
        latched = sum(1 for r in mine if r.latched)
        row(
            f"  {LABELS[kind]}: how / latched / ready again (p50 / max)",
            f"{tally.work_how.get(kind, '-')} / {latched} of {len(mine)} / {_p50_max(again)}",
            len(again) != len(mine) or (kind == "audit_full" and latched != len(mine)),
            f"a node faulted by {LABELS[kind]} not ready again"
            + (" or not latched" if kind == "audit_full" else ""),
        )
    stops = [r for r in tally.rounds if r.kind == "sigstop"]
    if stops:
        stood = sum(1 for r in stops if r.stood_by)
        row("old leader stood by after SIGCONT", f"{stood} / {len(stops)}", stood != len(stops))
    terms = [r for r in tally.rounds if r.kind == "sigterm"]
    if terms:
        clean = sum(1 for r in terms if r.exit_code == 0)
        codes = ", ".join(str(r.exit_code) for r in terms if r.exit_code != 0)
        row(
            "SIGTERM stops, exit 0",
            f"{clean} / {len(terms)}" + (f" (others: {codes})" if codes else ""),
            clean != len(terms),
            "a SIGTERM stop not clean",
        )
    terminated = [r.sessions for r in tally.rounds if r.kind == "pg_terminate"]
    if terminated:
        row("sessions ended by pg_terminate_backend", sum(terminated))
    restarts = [r.server_back_s for r in tally.rounds if r.server_back_s is not None]
    if restarts:
        row("PostgreSQL back after pg_ctl restart (p50 / max)", _p50_max(restarts))
    row(
        "final SIGTERM stops",
        ", ".join(f"{n} exit {c}" for n, c in tally.final_stops.items()) or "-",
        any(c != 0 for c in tally.final_stops.values()) or not tally.final_stops,
        "a final SIGTERM stop not clean",
    )
    row("node starts", ", ".join(f"{n} {c}" for n, c in tally.starts.items()))
    row("unexpected node exits", len(tally.unexpected_exits), bool(tally.unexpected_exits))
    row("stalls (no leader within the bound)", len(tally.stalls), bool(tally.stalls))
    nodes = " / ".join(names)
    row(
        f"lost ({nodes} files)",
        per_node({n: len(f.lost) for n, f in found.items()}),
        any(f.lost for f in found.values()),
        "events lost",
    )
    row(
        f"double outcomes ({nodes} files)",
        per_node({n: len(f.doubled) for n, f in found.items()}),
        any(f.doubled for f in found.values()),
        "events with more than one outcome line",
    )
    row("published ids without an inbox row", len(first.missing_inbox), bool(first.missing_inbox))
    row(
        "triage requests / receipts",
        f"{first.triage_keys} / {first.receipts}",
        any(f.missing_receipts or f.stray_receipts for f in found.values()),
        "triage requests not receipted once",
    )
    row("duplicate effects at the receiver", first.duplicate_effects, bool(first.duplicate_effects))
    row("redeliveries absorbed (receiver repeats)", first.redeliveries)
    row(
        f"requests audited as delivered != once ({nodes})",
        per_node({n: len(f.delivered_lines_not_one) for n, f in found.items()}),
        any(f.delivered_lines_not_one for f in found.values()),
    )
    older = journal.older_term_rows()
    row(
        "journal rows of an older term after a newer term's first",
        len(older) if not older else f"{len(older)} (seq {', '.join(map(str, older[:10]))})",
        bool(older),
    )
    written = sorted({r.term for r in journal.rows})
    row(
        "terms that wrote to the journal",
        f"{len(written)} ({written[0]}..{written[-1]})" if written else "0",
    )
    notices = journal.takeovers()
    history = _history(tally, journal)
    taken = {t for t, node in history.items() if t - 1 in history and history[t - 1] != node}
    unnoticed = sorted(t for t in taken if not notices[t])
    twice = sorted(t for t, n in notices.items() if n > 1)
    wrong = sorted(t for t in notices if t not in taken and t - 1 in history and t in history)
    row(
        "takeover notices / terms seen taken from another node",
        f"{sum(notices.values())} / {len(taken)}"
        + (f" (no notice: terms {unnoticed[:10]})" if unnoticed else "")
        + (f" (twice: terms {twice[:10]})" if twice else "")
        + (f" (not a takeover: terms {wrong[:10]})" if wrong else ""),
        bool(unnoticed or twice or wrong),
        "takeover notices not one per takeover",
    )
    unplanned = _unplanned(tally)
    row(
        "terms no fault explains (a lease lost on its own)",
        len(unplanned)
        if not unplanned
        else f"{len(unplanned)} (terms {', '.join(map(str, unplanned[:10]))})",
    )
    for name in names:
        mismatch = tally.mirrors.get(name, "not compared")
        row(
            f"audit files of {name} == journal",
            f"equal above seq {tally.mirror_floor} ({journal.last_seq} rows)"
            if mismatch is None
            else mismatch,
            mismatch is not None,
            f"node {name}'s audit files differ from the journal",
        )
    row(
        "after publishing stopped: recorded / receipted / mirrors equal",
        f"{_s(tally.catch_up_s)} / {_s(tally.receipts_s)} / {_s(tally.mirrors_s)}",
    )
    row("drill wall time", _s(tally.wall_s))
    row("verdict", "PASS" if not why else "FAIL: " + "; ".join(why))

    kept_dirs = "kept" if tally.kept else "removed (use --keep to inspect them)"
    print(
        f"ntfy-intake drill --standby: seed {tally.seed}, {tally.rounds_requested} rounds,"
        f" nodes {' and '.join(names)}, lease_ttl {tally.lease_ttl:g}s,"
        f" renew_every {tally.renew_every:g}s"
        + (
            f", yield_after {tally.yield_after:g}s, probe_every {tally.probe_every:g}s"
            if tally.work_how
            else ""
        ),
        file=out,
    )
    print(f"target: {tally.target}", file=out)
    print(f"store: {tally.store}", file=out)
    dirs = ", ".join(str(d) for d in tally.state_dirs)
    print(f"state dirs: {dirs} ({kept_dirs})", file=out)
    width = max(len(r[0]) for r in rows)
    print(file=out)
    for label, value, status in rows:
        line = f"  {label.ljust(width)}  {value}"
        if status == "FAIL":
            line += "   <-- FAIL"
        print(line, file=out)
    details = [
        ("rounds over the bound", [r.describe() for r in tally.rounds if tally.late(r)]),
        ("unexpected exits", tally.unexpected_exits),
        ("stalls", tally.stalls),
        *((f"lost ids ({n})", f.lost) for n, f in found.items()),
        *((f"doubled ids ({n})", sorted(f.doubled)) for n, f in found.items()),
        ("triage keys without a receipt", first.missing_receipts),
    ]
    shown = [(label, items) for label, items in details if items]
    if shown:
        print(file=out)
        for label, items in shown:
            print(f"  {label}: {'; '.join(list(items)[: drill_report.SHOW_IDS])}", file=out)
    out.flush()
    return not why


def _history(tally: StandbyTally, journal: Journal) -> dict[int, str]:
    """Each term's node, as far as the drill knows it: every read of the lease row, and each
    takeover notice's own account (the node that took the term, the one that held the term
    before)."""
    history = dict(tally.terms)
    for r in journal.rows:
        if not r.notice:
            continue
        term = handover_term(r.notice, r.term)
        # A takeover names the node that took the term and the one before; a yield the one
        # that gave it up (`node`) and the one it went to (`to`).
        took, before = r.notice.get("node"), r.notice.get("previous_node")
        if r.notice.get("notice") == "yielded":
            took, before = r.notice.get("to"), r.notice.get("node")
        if took and before:
            history.setdefault(term, took)
            history.setdefault(term - 1, before)
    return history


def _unplanned(tally: StandbyTally) -> list[int]:
    """Terms begun beyond one per fault: within a round (a new leader that lost its term at
    once) or between rounds."""
    out: list[int] = []
    previous = min(tally.terms, default=1)  # the first leader's term
    for r in tally.rounds:
        out += range(previous + 1, r.term_before + 1)  # begun between rounds
        if r.term_after is not None:
            out += range(r.term_before + 2, r.term_after + 1)  # more than one in the round
            previous = r.term_after
        else:
            previous = r.term_before
    return out
