"""The drill's final check and verdict table (see drill.py and docs/drill.md).

`check()` compares what the drill published with what the daemon durably recorded (audit `event`
lines and inbox rows) and with what the reference receiver settled (its receipts).
`render()` prints the table; `passed()` is the verdict: PASS only when nothing was lost, nothing
was recorded twice, every triage request reached the receiver exactly once as an effect, and the
daemon never hung or died on its own.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ntfy_intake.store import audit
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.drill_store import StoreView

SHOW_IDS = 10


@dataclass
class Tally:
    """What the drill did, counted while it ran."""

    target: str
    seed: int
    kills_requested: int
    state_dir: Path
    store: str = "-"  # the daemon's store: a SQLite file, or PostgreSQL host/database, schema
    kept: bool = False
    published: int = 0
    published_by_topic: Counter[str] = field(default_factory=Counter)
    publish_errors: int = 0
    random_kills: int = 0
    early_kills: int = 0  # random kills that landed before the restart had caught up
    crash_kills: Counter[str] = field(default_factory=Counter)
    crash_not_reached: list[str] = field(default_factory=list)
    sigterm_restarts: int = 0
    sigterm_unclean: list[str] = field(default_factory=list)
    final_stop: str = "-"  # the SIGTERM after the final catch-up
    unexpected_exits: list[str] = field(default_factory=list)
    starts: int = 0
    recovery: list[float] = field(default_factory=list)
    stalls: list[str] = field(default_factory=list)  # a daemon that did not catch up in time
    faults: dict[str, str] = field(default_factory=dict)  # fault -> what happened / skipped
    expect_fallback_400: bool = False
    catch_up_s: float | None = None  # publishing stopped -> every event recorded
    receipts_s: float | None = None  # publishing stopped -> every triage request receipted
    wall_s: float = 0.0


@dataclass
class Findings:
    """The final comparison of published ids, the audit log, the inbox and the receiver."""

    lost: list[str]
    doubled: dict[str, int]
    missing_inbox: list[str]
    foreign_recorded: int  # event lines for ids this drill did not publish (older topic history)
    triage_keys: int
    receipts: int
    missing_receipts: list[str]
    stray_receipts: list[str]
    duplicate_effects: int
    redeliveries: int
    delivered_lines_not_one: dict[str, int]
    gap_notices: int
    fallback_notices: int
    quarantined: int


def check(
    published: Sequence[str], state_dir: Path, receiver_db: Path, store: StoreView
) -> Findings:
    records = list(audit.read_records(state_dir / "audit"))
    events = [r for r in records if r.get("kind") == "event"]
    counts = Counter(str(r.get("event_id")) for r in events)
    wanted = set(published)
    lost = [i for i in published if counts[i] == 0]
    doubled = {i: n for i, n in counts.items() if n > 1}
    inbox_ids = {str(r[0]) for r in store.rows("SELECT event_id FROM inbox") or []}
    missing_inbox = [i for i in published if i not in inbox_ids]
    triage_keys = {str(r["delivery_key"]) for r in events if r.get("delivery_key")}
    delivered = Counter(
        str(r.get("delivery_key"))
        for r in records
        if r.get("kind") == "delivery" and r.get("result") == "delivered"
    )
    stored = receiver.receipts(receiver_db)
    receipt_keys = Counter(r.key for r in stored)
    return Findings(
        lost=lost,
        doubled=doubled,
        missing_inbox=missing_inbox,
        foreign_recorded=sum(1 for i in counts if i not in wanted),
        triage_keys=len(triage_keys),
        receipts=len(receipt_keys),
        missing_receipts=sorted(triage_keys - set(receipt_keys)),
        stray_receipts=sorted(set(receipt_keys) - triage_keys),
        duplicate_effects=sum(n - 1 for n in receipt_keys.values() if n > 1),
        redeliveries=sum(r.repeats for r in stored),
        delivered_lines_not_one={
            k: delivered[k] for k in sorted(triage_keys) if k in receipt_keys and delivered[k] != 1
        },
        gap_notices=_notices(records, "gap"),
        fallback_notices=_notices(records, "fallback_400"),
        quarantined=sum(1 for r in records if r.get("kind") == "quarantine"),
    )


def _notices(records: Iterable[dict[str, object]], kind: str) -> int:
    return sum(1 for r in records if r.get("kind") == "notice" and r.get("notice") == kind)


def failures(tally: Tally, found: Findings) -> list[str]:
    """Why the drill fails; empty means PASS."""
    why = []
    if found.lost:
        why.append(f"{len(found.lost)} event(s) lost")
    if found.doubled:
        why.append(f"{len(found.doubled)} event(s) with more than one outcome line")
    if found.missing_inbox:
        why.append(f"{len(found.missing_inbox)} event(s) without an inbox row")
    if found.missing_receipts:
        why.append(f"{len(found.missing_receipts)} triage request(s) never reached the receiver")
    if found.stray_receipts:
        why.append(f"{len(found.stray_receipts)} receipt(s) for requests the audit log never made")
    if found.duplicate_effects:
        why.append(f"{found.duplicate_effects} duplicate effect(s) at the receiver")
    if found.delivered_lines_not_one:
        why.append(f"{len(found.delivered_lines_not_one)} request(s) audited as delivered != 1x")
    if tally.expect_fallback_400 and found.fallback_notices == 0:
        why.append("a forced 400 dropped the cursor without a fallback_400 notice")
    if tally.sigterm_unclean:
        why.append(f"{len(tally.sigterm_unclean)} SIGTERM stop(s) not clean")
    if tally.unexpected_exits:
        why.append(f"{len(tally.unexpected_exits)} unexpected daemon exit(s)")
    if tally.stalls:
        why.append(f"{len(tally.stalls)} stall(s): the daemon did not catch up in time")
    return why


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:SHOW_IDS])
    return shown + (f", ... (+{len(ids) - SHOW_IDS})" if len(ids) > SHOW_IDS else "")


def render(tally: Tally, found: Findings, out: TextIO) -> bool:
    """Print the verdict table; return True on PASS."""
    why = failures(tally, found)
    kept = "kept" if tally.kept else "removed (use --keep to inspect it)"
    rows: list[tuple[str, str, str]] = []

    def row(label: str, value: object, bad: bool | None = None) -> None:
        rows.append((label, str(value), "" if bad is None else ("FAIL" if bad else "ok")))

    topics = ", ".join(f"{t} {n}" for t, n in sorted(tally.published_by_topic.items()))
    row("events published", f"{tally.published} ({topics})" if topics else tally.published)
    if tally.publish_errors:
        row("publish errors (retried or given up)", tally.publish_errors)
    crash_total = sum(tally.crash_kills.values())
    row(
        "kills: random / by crash point",
        f"{tally.random_kills} / {crash_total}"
        + (f" ({tally.early_kills} random kills before catch-up)" if tally.early_kills else ""),
    )
    if tally.crash_kills or tally.crash_not_reached:
        detail = ", ".join(f"{p} {n}" for p, n in sorted(tally.crash_kills.items()))
        if tally.crash_not_reached:
            detail += f"; not reached (killed by pid instead): {len(tally.crash_not_reached)}"
        row("  crash points", detail)
    row(
        "SIGTERM restarts",
        f"{tally.sigterm_restarts} ({len(tally.sigterm_unclean)} unclean)",
        bool(tally.sigterm_unclean),
    )
    row("final SIGTERM stop", tally.final_stop, tally.final_stop != "exit 0")
    row("daemon starts", tally.starts)
    for name, what in tally.faults.items():
        row(name, what)
    row("unexpected daemon exits", len(tally.unexpected_exits), bool(tally.unexpected_exits))
    row("stalls (no catch-up within the bound)", len(tally.stalls), bool(tally.stalls))
    row("lost", len(found.lost), bool(found.lost))
    row("double outcomes", len(found.doubled), bool(found.doubled))
    row("published ids without an inbox row", len(found.missing_inbox), bool(found.missing_inbox))
    if found.foreign_recorded:
        row("recorded ids not published by this drill", found.foreign_recorded)
    row(
        "triage requests / receipts",
        f"{found.triage_keys} / {found.receipts}",
        bool(found.missing_receipts or found.stray_receipts),
    )
    row("duplicate effects at the receiver", found.duplicate_effects, bool(found.duplicate_effects))
    row("redeliveries absorbed (receiver repeats)", found.redeliveries)
    row(
        "requests audited as delivered != once",
        len(found.delivered_lines_not_one),
        bool(found.delivered_lines_not_one),
    )
    row(
        "fallback_400 / gap notices",
        f"{found.fallback_notices} / {found.gap_notices}",
        tally.expect_fallback_400 and found.fallback_notices == 0,
    )
    if tally.recovery:
        row(
            "recovery time max / median",
            f"{_seconds(max(tally.recovery))} / {_seconds(statistics.median(tally.recovery))}"
            f" (n={len(tally.recovery)})",
        )
    else:
        row("recovery time max / median", "- (no restart caught up)")
    row(
        "after publishing stopped: all recorded / all receipted",
        f"{_seconds(tally.catch_up_s)} / {_seconds(tally.receipts_s)}",
    )
    row("drill wall time", _seconds(tally.wall_s))
    row("verdict", "PASS" if not why else "FAIL: " + "; ".join(why))

    print(
        f"ntfy-intake drill: seed {tally.seed}, {tally.kills_requested} kills, "
        f"target {tally.target}",
        file=out,
    )
    print(f"state dir: {tally.state_dir} ({kept})", file=out)
    print(f"store: {tally.store}", file=out)
    width = max(len(r[0]) for r in rows)
    print(file=out)
    for label, value, status in rows:
        line = f"  {label.ljust(width)}  {value}"
        if status == "FAIL":
            line += "   <-- FAIL"
        print(line, file=out)
    details = [
        ("lost ids", found.lost),
        ("doubled ids", sorted(found.doubled)),
        ("ids without an inbox row", found.missing_inbox),
        ("triage keys without a receipt", found.missing_receipts),
        ("receipts without an audited request", found.stray_receipts),
        ("keys audited as delivered != once", sorted(found.delivered_lines_not_one)),
        ("unclean SIGTERM stops", tally.sigterm_unclean),
        ("unexpected exits", tally.unexpected_exits),
        ("stalls", tally.stalls),
        ("crash points not reached", tally.crash_not_reached),
    ]
    shown = [(label, ids) for label, ids in details if ids]
    if shown:
        print(file=out)
        for label, ids in shown:
            print(f"  {label}: {_ids(list(ids))}", file=out)
    out.flush()
    return not why
