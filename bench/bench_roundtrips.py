"""Round trips to PostgreSQL per live event, statement by statement (issue 23, second round).

The live latency bench's scenario (daemon subprocess, the store on PostgreSQL, debounce 0, one
event at a time, each a new incident, the in-thread emulator and reference receiver), with a
tracer loaded into the daemon (`sitecustomize`, from a temp dir on PYTHONPATH) that wraps
psycopg's `Connection.wait`: each call is an exchange with the server (a send, or a send and the wait for its
answer); the ones in which an answer was read (the socket became readable, not a send
alone) are the round trips counted. Each is labelled with the store function that
caused it and the path it ran for (the writer's batch, the audit flush, the relay's claim or
settle, the ticker), its statement's first words and how long it took.

Printed: round trips per event by path and by statement, and their time; the totals divided by
the events measured (background work, such as the cursor's save every reorder window and the
last frame's time every second, counts in whatever it costs per event).

Run alone: NTFY_INTAKE_TEST_DATABASE=postgresql://... uv run python bench/bench_roundtrips.py
[--events 200]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import bench_latency
import bench_replay
from _common import AuditCounter, daemon, daemon_env
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

WARMUP = 20
STEP_TIMEOUT_S = 10.0

# Loaded by the daemon at start-up: every psycopg wait (one round trip) is recorded with the
# store function and the flow path it ran for, the statement and its duration.
TRACER = r"""
import os, sys, threading, time, traceback

_out = open(os.environ["NTFY_TRACE_FILE"], "a", buffering=1)
_lock = threading.Lock()
_local = threading.local()
_PATHS = (
    ("_write_batch", "writer: batch"), ("flush_sync", "audit flush (writer, relay)"),
    ("_settle_and_claim", "relay"), ("next_due_at", "relay: next due"),
    ("settle_cursor", "ticker: cursor"), ("save_last_frame_time", "ticker: frame time"),
    ("release_due", "writer: release"), ("heartbeat", "vitals"),
)
_STORE_PATHS = {"cursor.save": "ticker: cursor", "cursor.save_last_frame_time": "ticker: frame time"}


def _label():
    frames = traceback.extract_stack(limit=40)
    store = flow = None
    for frame in reversed(frames):
        name = frame.filename
        if "/ntfy_intake/" not in name:
            continue
        if store is None and "/ntfy_intake/store/" in name and "postgres.py" not in name \
                and "transaction.py" not in name:
            store = f"{name.rsplit('/', 1)[1][:-3]}.{frame.name}"
        for func, path in _PATHS:
            if frame.name == func and flow is None and "/ntfy_intake/store/" not in name:
                flow = path
    if flow is None and store in _STORE_PATHS:
        flow = _STORE_PATHS[store]  # run in the worker thread for a loop in another one
    if flow is None:
        for frame in reversed(frames):
            if "/ntfy_intake/" in frame.filename and "/store/" not in frame.filename:
                flow = f"{frame.filename.rsplit('/', 1)[1][:-3]}.{frame.name}"
                break
    if store is None:
        for frame in reversed(frames):
            if frame.filename.endswith("transaction.py"):
                store = f"transaction.{frame.name}"
                break
    return flow or "?", store or "?"


def _install():
    import psycopg
    from ntfy_intake.store import postgres

    wait = psycopg.Connection.wait

    def reads(gen, box):
        # Passes psycopg's generator through, noting whether an answer was read in it (the
        # socket became readable): a round trip. A wait that only sent is not one.
        try:
            state = next(gen)
            while True:
                ready = yield state
                if isinstance(ready, int) and ready & 1:  # Ready.R
                    box.append(1)
                state = gen.send(ready)
        except StopIteration as stop:
            return stop.value

    def traced_wait(self, gen, *args, **kwargs):
        began = time.monotonic()
        box = []
        try:
            return wait(self, reads(gen, box), *args, **kwargs)
        finally:
            if box:
                took = time.monotonic() - began
                flow, store = _label()
                sql = getattr(_local, "sql", "")
                with _lock:
                    _out.write(f"{began:.6f}\t{took * 1e3:.3f}\t{flow}\t{store}\t{sql}\n")

    psycopg.Connection.wait = traced_wait

    def note(method):
        def wrapped(self, sql, *args, **kwargs):
            text = sql.decode() if isinstance(sql, bytes) else str(sql)
            _local.sql = " ".join(text.split())[:70]
            return method(self, sql, *args, **kwargs)
        return wrapped

    for name in ("execute", "executemany"):
        setattr(postgres.PgConnection, name, note(getattr(postgres.PgConnection, name)))
    begin = postgres.PgConnection.begin_write

    def traced_begin(self, *args, **kwargs):
        _local.sql = "BEGIN; lock, notify, fence"
        return begin(self, *args, **kwargs)

    postgres.PgConnection.begin_write = traced_begin
    # The pipelined write transaction (issue 23, second round), where it exists: its waits are
    # labelled by what they wait for, not by the last statement sent.
    commit = getattr(postgres.PgConnection, "commit_write", None)
    if commit is not None:

        def traced_commit(self, *args, **kwargs):
            _local.sql = "COMMIT (with what is outstanding)"
            return commit(self, *args, **kwargs)

        postgres.PgConnection.commit_write = traced_commit
    answer = getattr(postgres, "Answer", None)
    if answer is not None:
        ready = answer._ready

        def traced_ready(self):
            query = getattr(self._cursor, "_last_query", None) or ""
            text = query.decode(errors="replace") if isinstance(query, bytes) else str(query)
            _local.sql = "read: " + " ".join(text.split())[:64]
            return ready(self)

        answer._ready = traced_ready


if os.environ.get("NTFY_TRACE_FILE"):
    _install()
"""


def trace(workdir: Path, events: int, dsn: str) -> tuple[list[tuple[float, float]], Path]:
    """Run the live scenario with the tracer in the daemon; the (publish, received) times of the
    measured events and the trace file."""
    tracer = workdir / "tracer"
    tracer.mkdir()
    (tracer / "sitecustomize.py").write_text(TRACER)
    trace_file = workdir / "trace.tsv"
    received_at: dict[str, float] = {}
    arrived = threading.Condition()

    def decide(body: dict[str, object]) -> None:
        now = time.monotonic()
        with arrived:
            for event in body.get("events") or []:  # type: ignore[attr-defined]
                received_at[str(event["id"])] = now
            arrived.notify_all()

    state = workdir / "state"
    windows: list[tuple[float, float]] = []
    with contextlib.ExitStack() as stack:
        emu = stack.enter_context(
            NtfyEmulator(EmulatorConfig(keepalive_interval=1.0, manager_interval=None)).running()
        )
        url = stack.enter_context(receiver.running(workdir / "rx.sqlite3", decide=decide)).url
        env = daemon_env(emu.url, state, relay_url=url, cadence_debounce="0s")
        env["NTFY_INTAKE_STATE_DATABASE"] = dsn
        env["NTFY_TRACE_FILE"] = str(trace_file)
        env["PYTHONPATH"] = os.pathsep.join([str(tracer), *sys.path])
        stack.enter_context(daemon(env, workdir / "daemon.log"))
        emu.wait_for_subscribers(1, timeout=30)
        counter = AuditCounter(state / "audit")
        for i in range(WARMUP + events):
            began, _, got = bench_latency.probe(
                emu, counter, arrived, received_at, i, "roundtrip probe"
            )
            if i >= WARMUP:
                windows.append((began, got))
        # The last delivery's settle and flush, then the ticker's next cursor save.
        time.sleep(1.5)
    return windows, trace_file


def summarize(windows: list[tuple[float, float]], trace_file: Path) -> dict[str, object]:
    start, end = windows[0][0], windows[-1][0] + (windows[-1][0] - windows[0][0]) / len(windows)
    n = len(windows)
    by_path: collections.Counter[str] = collections.Counter()
    by_path_ms: collections.Counter[str] = collections.Counter()
    by_statement: collections.Counter[tuple[str, str, str]] = collections.Counter()
    by_statement_ms: collections.Counter[tuple[str, str, str]] = collections.Counter()
    on_path = 0  # round trips between a publish and its receipt
    bounds = iter(windows)
    window = next(bounds, None)
    for line in trace_file.read_text().splitlines():
        at_text, took_text, flow, store, sql = (line.split("\t") + [""] * 5)[:5]
        at, took = float(at_text), float(took_text)
        if not start <= at < end:
            continue
        while window is not None and at >= window[1]:
            window = next(bounds, None)
        if window is not None and window[0] <= at < window[1]:
            on_path += 1
        by_path[flow] += 1
        by_path_ms[flow] += took
        by_statement[(flow, store, sql)] += 1
        by_statement_ms[(flow, store, sql)] += took
    return {
        "events": n,
        "round_trips_per_event": sum(by_path.values()) / n,
        "between_publish_and_receipt_per_event": on_path / n,
        "ms_per_event": sum(by_path_ms.values()) / n,
        "paths": {path: (count / n, by_path_ms[path] / n) for path, count in by_path.most_common()},
        "statements": [
            (flow, store, sql, count / n, by_statement_ms[(flow, store, sql)] / count)
            for (flow, store, sql), count in by_statement.most_common()
        ],
    }


def render(summary: dict[str, object]) -> str:
    lines = [
        f"events measured: {summary['events']}",
        f"round trips per event: {summary['round_trips_per_event']:.1f}"
        f" ({summary['between_publish_and_receipt_per_event']:.1f} between a publish and its"
        f" receipt), {summary['ms_per_event']:.2f} ms waiting on the server per event",
        "",
        "| path | round trips / event | ms / event |",
        "|---|---|---|",
    ]
    paths = summary["paths"]
    assert isinstance(paths, dict)
    for path, (count, took) in paths.items():
        lines.append(f"| {path} | {count:.2f} | {took:.2f} |")
    lines += [
        "",
        "| path | store function | statement | per event | ms each |",
        "|---|---|---|---|---|",
    ]
    statements = summary["statements"]
    assert isinstance(statements, list)
    for flow, store, sql, count, each in statements:
        if count < 0.05:
            continue
        lines.append(f"| {flow} | {store} | `{sql}` | {count:.2f} | {each:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args()
    server = bench_replay.bench_database()
    if server is None:
        raise SystemExit("needs NTFY_INTAKE_BENCH_DATABASE or NTFY_INTAKE_TEST_DATABASE")
    with (
        tempfile.TemporaryDirectory(prefix="bench-roundtrips-") as tmp,
        bench_replay.fresh_schema(server) as dsn,
    ):
        windows, trace_file = trace(Path(tmp), args.events, dsn)
        summary = summarize(windows, trace_file)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1))
    print(render(summary))


if __name__ == "__main__":
    main()
