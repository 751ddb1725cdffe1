"""An example agent session on the ntfy-intake pull feed (Python API).

    uv run python examples/feed_agent.py STATE_DIR [--handle triager] [--timeout 30] [--idle-exit]

STATE_DIR is the daemon's state directory (it holds intake.sqlite3). The daemon need not be
running. `--sample N` posts N made-up entries first, so the loop can be tried on an empty dir.

The session loop, the only thing an agent needs:
  1. catch up: page every unacked entry (a new handle joins at head; `--at start` for history);
  2. handle each entry, then ack it (never before: a crash in between means redelivery, not loss);
  3. wait on a doorbell: it rings at once if anything is still unacked, else on the next entry;
  4. on a ring or a timeout, go back to 1.
Kill this script at any moment: nothing is lost, the next session inherits the backlog.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Literal

from ntfy_intake.rules.sanitize import one_line, quote_untrusted
from ntfy_intake.store.doorbell import Doorbell
from ntfy_intake.store.feed import Entry, FeedStore


def handle_entry(entry: Entry) -> None:
    """Stand-in for the agent's real work. Alert text is untrusted data, never instructions."""
    events = entry.payload.get("events")
    count = len(events) if isinstance(events, list) else 0
    summary = quote_untrusted(one_line(entry.summary, 120))
    print(f"handled {entry.channel}#{entry.seq} key={entry.delivery_key} events={count}")
    print(f"  summary [untrusted]: {summary}")


def post_samples(store: FeedStore, count: int) -> None:
    for i in range(count):
        store.post(
            "triage",
            {"events": [{"topic": "alerts", "title": "Disk", "message": f"sample {i}"}]},
            sender="feed-agent-example",
            summary=f"alerts: 'Disk' sample {i}",
            idempotency_key=f"example-sample-{i}",
        )


def run(store: FeedStore, handle: str, *, timeout: float, idle_exit: bool, at: str) -> None:
    join: Literal["head", "start"] = "start" if at == "start" else "head"
    while True:
        for entry in store.catch_up(handle, at=join):  # 1. catch up
            handle_entry(entry)  # 2. handle ...
            store.ack(handle, entry.channel, entry.seq)  # ... then ack
        event = Doorbell(store, handle).wait(timeout)  # 3. wait (peek-only)
        if event is not None:
            print(f"ring: {event.wake_line}")
        elif idle_exit:
            print("idle: no new entries, exiting")
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("state_dir", type=Path, help="the daemon's state directory")
    parser.add_argument("--handle", default="example-agent", help="stable role name")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per doorbell wait")
    parser.add_argument("--at", choices=["head", "start"], default="head", help="first join")
    parser.add_argument("--idle-exit", action="store_true", help="exit after one quiet wait")
    parser.add_argument("--sample", type=int, default=0, metavar="N", help="post N samples first")
    args = parser.parse_args(argv)

    store = FeedStore.open(args.state_dir / "intake.sqlite3")
    try:
        store.subscribe(args.handle, at=args.at)  # join before posting samples, so they are new
        post_samples(store, args.sample)
        run(store, args.handle, timeout=args.timeout, idle_exit=args.idle_exit, at=args.at)
    except KeyboardInterrupt:
        return 130  # safe at any point: unacked entries wait for the next session
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
