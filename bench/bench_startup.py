"""Start-up (cadence rehydration) time as the audit history grows.

Generates synthetic audit logs in a temp dir and times `rehydrate.load(...)`, which reads only
the files its longest window needs, against folding every file. Three histories:

    1x history   DAYS days at PER_DAY records/day
    10x history  10 * DAYS days at the same rate      -> load time should stay flat
    10x rate     DAYS days at 10 * PER_DAY records/day -> load time follows the recent traffic

Run: uv run python bench/bench_startup.py [--days 30] [--per-day 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from ntfy_intake.rules.cadence import CadenceState, Policy
from ntfy_intake.rules.timestamps import rfc3339
from ntfy_intake.store import audit, rehydrate

END = datetime.fromisoformat("2025-11-30T12:00:00Z").timestamp()
DAY = 86400.0
INCIDENTS = 40


def synthesize(directory: Path, days: int, per_day: int) -> int:
    """A plausible mix: events (requests, joins, suppressions), deliveries, owner messages."""
    directory.mkdir(parents=True)
    seq = 0
    start = END // DAY * DAY - days * DAY  # whole UTC days, up to the midnight before END
    for day in range(days):
        day_start = start + day * DAY
        name = datetime.fromtimestamp(day_start, UTC).strftime("%Y-%m-%d")
        lines = []
        for i in range(per_day):
            ts = rfc3339(day_start + i * DAY / per_day)
            incident = f"alerts:incident {(day * per_day + i) % INCIDENTS}"
            kind = i % 10
            if kind == 0:
                record = {
                    "kind": "event",
                    "event_id": f"e{seq}",
                    "topic": "alerts",
                    "incident": incident,
                    "severity": 3 + i % 3,
                    "status": "firing",
                    "outcome": "triage_requested",
                    "reason": "repeat",
                    "delivery_key": f"tri_e{seq}",
                }
            elif kind == 1:
                record = {"kind": "delivery", "delivery_key": f"tri_e{seq - 1}", "attempt": 1}
                record["result"] = "delivered"
            elif kind == 2:
                record = {
                    "kind": "owner_message",
                    "key": f"notify:tri_e{seq - 2}",
                    "message_kind": "triage",
                    "result": "queued" if i % 100 < 20 else "suppressed",
                }
            else:
                record = {
                    "kind": "event",
                    "event_id": f"e{seq}",
                    "topic": "alerts",
                    "incident": incident,
                    "severity": 3,
                    "status": "firing",
                    "outcome": "suppressed",
                    "reason": "cooldown",
                }
            seq += 1
            envelope = {"v": 1, "seq": seq, "ts": ts, **record}
            lines.append(json.dumps(envelope, separators=(",", ":")) + "\n")
        (directory / f"audit-{name}.jsonl").write_text("".join(lines), encoding="ascii")
    return seq


def time_load(directory: Path, policy: Policy, repeat: int) -> tuple[float, rehydrate.Rehydrated]:
    timings = []
    result = None
    for _ in range(repeat):
        began = time.perf_counter()
        result = rehydrate.load(directory, policy, END)
        timings.append(time.perf_counter() - began)
    assert result is not None
    return statistics.median(timings), result


def time_full_fold(directory: Path, policy: Policy) -> float:
    began = time.perf_counter()
    state = CadenceState.empty(policy)
    for record in audit.read_records(directory):
        state.apply(record)
    state.prune(END)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--per-day", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    policy = Policy()
    scenarios = [
        ("1x history", args.days, args.per_day),
        ("10x history", 10 * args.days, args.per_day),
        ("10x rate", args.days, 10 * args.per_day),
    ]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for label, days, per_day in scenarios:
            directory = Path(tmp) / label.replace(" ", "-")
            total = synthesize(directory, days, per_day)
            load_s, result = time_load(directory, policy, args.repeat)
            full_s = time_full_fold(directory, policy)
            on_disk = len(audit.log_files(directory))
            rows.append((label, days, per_day, total, on_disk, result, load_s, full_s))

    print(
        f"policy retention {policy.retention / 3600:.0f} h (+1 day slack), median of {args.repeat}"
    )
    header = (
        f"{'history':<12} {'days':>5} {'rec/day':>8} {'records':>9} {'files':>6}"
        f" {'read':>5} {'rec read':>9} {'load ms':>9} {'full fold ms':>13}"
    )
    print(header)
    print("-" * len(header))
    for label, days, per_day, total, on_disk, result, load_s, full_s in rows:
        print(
            f"{label:<12} {days:>5} {per_day:>8} {total:>9} {on_disk:>6} {len(result.files):>5}"
            f" {result.records:>9} {load_s * 1000:>9.1f} {full_s * 1000:>13.1f}"
        )
    base, longer = rows[0], rows[1]
    print()
    print(
        f"10x history / 1x: load {longer[6] / base[6]:.2f}x, full fold {longer[7] / base[7]:.2f}x"
    )
    print(f"10x rate / 1x:    load {rows[2][6] / base[6]:.2f}x (the window itself holds 10x)")


if __name__ == "__main__":
    main()
