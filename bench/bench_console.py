"""The owner console's cost: page render time on a big store, and the writer's rate with it open.

    uv run python bench/bench_console.py            # 10,000 incidents / 100,000 events; 20,000 replay
    uv run python bench/bench_console.py --quick    # smaller, to check the bench itself

1. Server render time of the overview (`/console/`) and incidents (`/console/incidents`) pages,
   p50/p99 over repeated requests with a session, on a store of 10,000 incidents and 100,000
   events (bulk `executemany` into a migrated store, plus a triage request per incident). Timed
   inside the server (an ASGI wrapper: from the request reaching the app to its last body byte),
   so loopback and client time are left out. Same-run references: `/healthz` through the same
   app, and a bare read of what the incidents page reads (the store call alone, no template).
   Target: p99 < 50 ms.
2. The writer's replay rate (bench_replay's backlog, replayed from the emulator on a reconnect
   while the daemon runs: see `replay_rate`) with the console open (a browser-less client in a
   process of its own, logged in, fetching the overview every 200 ms: 25 times the page's own
   5 s refresh) against the same replay without it. Seven pairs by default, interleaved one by
   one (the order inside a pair alternates); the verdict is on the median of the seven
   console/bare ratios, and their range is printed with every run's rate. Target: within 5 %.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from _common import (
    Row,
    daemon,
    daemon_env,
    free_port,
    met,
    ms,
    percentile,
    proc_cpu_s,
    ratio,
    render,
    wait_for,
)
from bench_replay import publish_backlog
from ntfy_intake import settings as settings_mod
from ntfy_intake.rules import cadence
from ntfy_intake.runtime import heap
from ntfy_intake.store import audit, console_reads, db, migrations
from ntfy_intake.surfaces import console, http_api
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

TOKEN = "bench-console-token-7Hq2Xv9Lp4"
TARGET_P99_S = 0.050
TARGET_REPLAY_LOSS = 0.05
POLL_S = 0.2


# -- 1. render time on a big store -----------------------------------------------------------------


def build_store(path: Path, incidents: int, events: int, seed: int = 1) -> float:
    """A migrated store with `incidents` incidents and `events` events; seconds it took."""
    began = time.perf_counter()
    rng = random.Random(seed)
    conn = db.connect(path)
    try:
        migrations.apply(conn)
        now = int(time.time())
        conn.execute("PRAGMA synchronous=OFF")
        inbox_rows = []
        for i in range(events):
            incident = i % incidents
            when = now - (events - i)
            raw = json.dumps(
                {
                    "id": f"ev{i:08d}",
                    "time": when,
                    "event": "message",
                    "topic": "alerts",
                    "title": f"incident {incident}: disk {rng.randint(80, 99)}%",
                    "message": f"volume {incident} is filling up, event {i}",
                    "priority": 3 + i % 3,
                },
                separators=(",", ":"),
            )
            inbox_rows.append(
                (
                    f"ev{i:08d}",
                    "alerts",
                    when,
                    raw,
                    f"{i:064x}",
                    f"alerts:inc{incident}",
                    3 + i % 3,
                    "triaged",
                    "new",
                    time.time(),
                )
            )
        incident_rows = [
            (
                f"alerts:inc{n}",
                4,
                "firing",
                now,
                f"ev{n:08d}",
                now - events,
                now - (incidents - n),
                events // incidents,
                1,
            )
            for n in range(incidents)
        ]
        outbox_rows = [
            (f"tri_{n:012d}", f"alerts:inc{n}", "new", "delivered", 1, now, now)
            for n in range(incidents)
        ]
        with conn:
            conn.executemany(
                "INSERT INTO inbox (event_id, topic, time, raw, raw_sha256, incident_key,"
                " severity, outcome, reason, received_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                inbox_rows,
            )
            conn.executemany(
                "INSERT INTO incidents (key, severity, status, status_time, status_event,"
                " first_seen, last_seen, events, version) VALUES (?,?,?,?,?,?,?,?,?)",
                incident_rows,
            )
            conn.executemany(
                "INSERT INTO outbox (delivery_key, incident_key, reason, state, attempts, due_at,"
                " created_at) VALUES (?,?,?,?,?,?,?)",
                outbox_rows,
            )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return time.perf_counter() - began


class Timed:
    """ASGI wrapper: server time per path, from the call to the last body byte sent."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.times: dict[str, list[float]] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        path = scope["path"]

        async def timed_send(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.times.setdefault(path, []).append(time.perf_counter() - began)

        await self.app(scope, receive, timed_send)


@contextlib.contextmanager
def console_server(state: Path) -> Iterator[tuple[str, Timed]]:
    env = {
        "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
        "NTFY_INTAKE_NTFY_TOPICS": "alerts,backups",
        "NTFY_INTAKE_STATE_DIR": str(state),
        "NTFY_INTAKE_HTTP_TOKEN": TOKEN,
    }
    config = settings_mod.load(None, env)
    policy = cadence.Policy()
    cadence_state = cadence.CadenceState.empty(policy)

    def health() -> tuple[bool, dict[str, Any]]:
        return True, {"status": "healthy"}

    routes = console.routes(
        console.Config(config, health, lambda: (policy, cadence_state), actions=None)
    )
    app = http_api.create_app(
        db_path=config.state.store,
        token=TOKEN,
        notify=None,
        health=health,
        metrics_snapshot=dict,
        extra_routes=routes,
    )
    timed = Timed(app)
    serving = _serve.serving(timed, on_stop=lambda: http_api.begin_shutdown(app))
    # heap.frozen: as the daemon does while its HTTP surface serves (runtime/daemon.py).
    with serving as url, heap.frozen():
        yield url, timed


def log_in(client: httpx.Client) -> None:
    form = client.get("/console/login").text
    found = re.search(r'name="csrf" value="([^"]+)"', form)
    assert found is not None, "no CSRF token on the login page"
    answer = client.post("/console/login", data={"csrf": found.group(1), "token": TOKEN})
    assert answer.status_code == 303, answer.status_code


def render_times(workdir: Path, incidents: int, events: int, rounds: int) -> dict[str, Any]:
    state = workdir / "render"
    (state / "audit").mkdir(parents=True, exist_ok=True)
    built_s = build_store(state / "intake.sqlite3", incidents, events)
    with console_server(state) as (url, timed), httpx.Client(base_url=url, timeout=30) as client:
        log_in(client)
        for path in ("/console/", "/console/incidents", "/healthz"):
            for _ in range(5):  # warm: templates compiled, the read connection opened
                client.get(path).raise_for_status()
        timed.times.clear()
        for _ in range(rounds):
            for path in ("/console/", "/console/incidents", "/healthz"):
                assert client.get(path).status_code == 200, path
    conn = db.connect(state / "intake.sqlite3", readonly=True)
    bare: list[float] = []
    try:
        for _ in range(rounds):
            began = time.perf_counter()
            console_reads.incidents(conn)
            bare.append(time.perf_counter() - began)
    finally:
        conn.close()
    return {"times": timed.times, "bare": bare, "built_s": built_s}


def render_rows(found: dict[str, Any], incidents: int, events: int) -> list[Row]:
    times = found["times"]
    health = times["/healthz"]
    rows = []
    for path, name in (("/console/", "overview"), ("/console/incidents", "incidents")):
        values = times[path]
        p50, p99 = percentile(values, 50), percentile(values, 99)
        reference = health if name == "overview" else found["bare"]
        ref_name = "/healthz" if name == "overview" else "bare store read (console_reads.incidents)"
        rows.append(
            Row(
                f"console {name} page, server render p50 / p99 "
                f"({incidents:,} incidents, {events:,} events)",
                f"{ms(p50)} / {ms(p99)}",
                f"{ref_name} p50 / p99 {ms(percentile(reference, 50))} / "
                f"{ms(percentile(reference, 99))}",
                ratio(p99, percentile(reference, 99)),
                f"p99 < {TARGET_P99_S * 1000:g} ms",
                met(p99 < TARGET_P99_S),
            )
        )
    rows.append(
        Row(
            "  (same run) /healthz server time p50 / p99",
            f"{ms(percentile(health, 50))} / {ms(percentile(health, 99))}",
        )
    )
    return rows


# -- 1b. what a page costs the real daemon ----------------------------------------------------------

COST_PATHS = (
    ("/healthz", "/healthz"),
    ("/console/", "overview"),
    ("/console/incidents", "incidents"),
)


def fetch_costs(workdir: Path, rounds: int) -> dict[str, float]:
    """The daemon's own CPU (user + system, from /proc) per request, on the render store: a real
    `ntfy-intake run` process, idle otherwise (its idle CPU rate, measured first, is taken off).
    What a page costs the writer's process, whatever the wall clock of a busy machine says."""
    state = workdir / "render"
    port = free_port()
    config = EmulatorConfig(keepalive_interval=1.0, manager_interval=None)
    costs: dict[str, float] = {}
    with NtfyEmulator(config).running() as emu:
        env = daemon_env(emu.url, state, http_token=TOKEN, http_listen=f"127.0.0.1:{port}")
        with daemon(env, workdir / "costs.log") as proc:
            client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
            with client:

                def up() -> bool:
                    try:
                        return client.get("/healthz").status_code < 600
                    except httpx.HTTPError:
                        return False

                wait_for(up, 60, "the daemon's HTTP surface", interval=0.05)
                log_in(client)
                for path, _ in COST_PATHS:
                    for _ in range(10):
                        client.get(path).raise_for_status()
                began, idle_from = time.monotonic(), proc_cpu_s(proc.pid)
                time.sleep(2.0)
                idle = (proc_cpu_s(proc.pid) - idle_from) / (time.monotonic() - began)
                for path, name in COST_PATHS:
                    began, cpu = time.monotonic(), proc_cpu_s(proc.pid)
                    for _ in range(rounds):
                        assert client.get(path).status_code == 200, path
                    spent = proc_cpu_s(proc.pid) - cpu - idle * (time.monotonic() - began)
                    costs[name] = max(0.0, spent) / rounds
    return costs


def cost_rows(costs: dict[str, float]) -> list[Row]:
    overview = costs["overview"]
    return [
        Row(
            "daemon CPU per request, real daemon on the same store: overview / incidents"
            " / /healthz",
            f"{ms(overview)} / {ms(costs['incidents'])} / {ms(costs['/healthz'])}",
            f"overview every {POLL_S * 1000:g} ms (the replay's watcher): "
            f"{overview / POLL_S:.1%} of one core; every 5 s (the page's refresh): "
            f"{overview / 5:.2%}",
        )
    ]


# -- 2. the writer's replay rate with the console open -----------------------------------------------


class Watcher:
    """A browser-less owner in a process of its own (`--watch PORT`), so its HTTP client does not
    share an interpreter with the emulator that feeds the replay. It logs in as soon as the
    daemon listens, then fetches the overview every POLL_S. With `fetch=False` it only waits
    for `/healthz` to answer (the console closed), so both conditions run the same processes
    and measure from the same moment: the HTTP surface up. Its report (a JSON file written on
    SIGTERM): when it opened, each successful fetch's time (CLOCK_MONOTONIC, shared by every
    process on the machine), failures."""

    def __init__(self, port: int, report: Path, *, fetch: bool) -> None:
        self.report = report
        args = [sys.executable, __file__, "--watch", str(port), "--report", str(report)]
        self.proc = subprocess.Popen(
            [*args, *(["--fetch"] if fetch else [])], stdin=subprocess.DEVNULL
        )

    @property
    def opened(self) -> bool:
        return self.report.with_suffix(".open").exists()

    def stop(self) -> dict[str, Any]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)
        found: dict[str, Any] = json.loads(self.report.read_text())
        return found


def watch(port: int, report: Path, *, fetch: bool) -> int:
    """The watcher process's loop (see Watcher)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    fetched: list[float] = []
    failures = 0
    opened_at = None
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        while not stop.is_set():  # the daemon binds its port a moment after spawn
            try:
                if fetch:
                    log_in(client)
                else:
                    client.get("/healthz").raise_for_status()
                opened_at = time.monotonic()
                report.with_suffix(".open").touch()
                break
            except (httpx.HTTPError, AssertionError):
                stop.wait(0.002)
        while fetch and not stop.is_set():
            try:
                ok = client.get("/console/").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                fetched.append(time.monotonic())
            failures += not ok
            stop.wait(POLL_S)
    report.write_text(
        json.dumps({"opened_at": opened_at, "fetched": fetched, "failures": failures})
    )
    return 0


class EventLines:
    """Counts the `event` lines the audit log has so far (complete lines only), by substring:
    this process also runs the emulator that sends the replay, so it parses nothing
    (`AuditCounter` decodes every line, which slowed the sender it shares an interpreter with)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.events = 0
        self._offsets: dict[Path, int] = {}

    def poll(self) -> int:
        for path in audit.log_files(self.directory):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            end = data.rfind(b"\n") + 1
            self.events += data[:end].count(b'"kind":"event"')
            self._offsets[path] = offset + end
        return self.events


@dataclass(frozen=True)
class Replay:
    rate: float  # events/s, from the first event audited to the last
    cpu_us: float  # the daemon's CPU (user + system) per event over the same span
    fetches: int  # overview fetches answered meanwhile


def replay_rate(workdir: Path, n: int, label: str, *, watch: bool) -> Replay:
    """Events/s (and the daemon's CPU per event) of a replay of n events while the daemon runs,
    the console open or not, and how many overview fetches answered meanwhile.

    The daemon loads its HTTP surface only once the writer has caught up with a start-up backlog
    (supervisor.after_subscribing), so no console can be open during a start-up replay. This is
    the replay that can meet an open console: the daemon is up and idle, its stream goes quiet
    while n events are published (cached by the emulator, not sent), then the stream is dropped
    and the daemon's reconnect replays all n from its cursor. Timed from the first of them
    audited to the last, so the reconnect's backoff is left out of both runs alike."""
    state = workdir / f"replay-{label}"
    log_path = workdir / f"replay-{label}.log"
    port = free_port()
    config = EmulatorConfig(keepalive_interval=1.0, manager_interval=None)
    with NtfyEmulator(config).running() as emu:
        env = daemon_env(emu.url, state, http_token=TOKEN, http_listen=f"127.0.0.1:{port}")
        counter = EventLines(state / "audit")
        watcher = Watcher(port, workdir / f"watch-{label}.json", fetch=watch)
        try:
            with daemon(env, log_path) as proc:
                emu.wait_for_subscribers(1, timeout=30)
                wait_for(lambda: watcher.opened, 30, "the HTTP surface", interval=0.01)
                emu.faults.silence(True)
                publish_backlog(emu, n, random.Random(1))
                emu.faults.silence(False)
                emu.faults.drop_connections()
                first: list[float] = []
                cpu: list[float] = []

                def progress() -> bool:
                    events = counter.poll()
                    if events and not first:
                        first.append(time.monotonic())
                        cpu.append(proc_cpu_s(proc.pid))
                    return events >= n or proc.poll() is not None

                wait_for(progress, 600, "replay", interval=0.01)
                done = time.monotonic()
                if proc.poll() is not None:
                    raise RuntimeError(f"daemon exited {proc.returncode} during the replay")
                cpu_us = (proc_cpu_s(proc.pid) - cpu[0]) / (n - 1) * 1e6
        finally:
            report = watcher.stop()
    fetched = sum(1 for t in report["fetched"] if first[0] <= t <= done)
    return Replay((n - 1) / max(1e-9, done - first[0]), cpu_us, fetched)


def replay_pairs(work: Path, n: int, pairs: int) -> dict[str, list[Replay]]:
    """`pairs` replays with the console open and as many without, interleaved one by one, each
    on a fresh daemon and store; the order inside a pair alternates (bare first, then console
    first, ...) so that a machine growing busier or quieter during the run weighs on both
    conditions alike. (One daemon for all of them drifts: each reconnect's overlap backfill
    re-reads the replays before it.)"""
    results: dict[str, list[Replay]] = {"bare": [], "console": []}
    for i in range(pairs):
        order = [("bare", False), ("console", True)]
        for label, watching in order if i % 2 == 0 else order[::-1]:
            print(f"bench: replay {n:,}, {label} #{i + 1} ...", file=sys.stderr)
            results[label].append(replay_rate(work, n, f"{label}-{i}", watch=watching))
    return results


def replay_rows(results: dict[str, list[Replay]], n: int) -> list[Row]:
    """The verdict on the median of the pairs' ratios (console / bare, each pair run back to
    back): one replay's rate moves by +-15 % from run to run on a shared machine, so a ratio of
    two single runs, or of the best of each, is decided by noise. The range is printed too, and
    the daemon's CPU per event, which the machine's other work moves less."""
    bare, open_ = results["bare"], results["console"]
    ratios = [c.rate / b.rate for b, c in zip(bare, open_, strict=True)]
    cpu = [c.cpu_us / b.cpu_us for b, c in zip(bare, open_, strict=True) if b.cpu_us > 0]
    mid = statistics.median(ratios)
    fetches = statistics.median(r.fetches for r in open_)

    def each(runs: list[Replay]) -> str:
        return ", ".join(f"{r.rate:,.0f}" for r in runs)

    def cpu_of(runs: list[Replay]) -> float:
        return statistics.median(r.cpu_us for r in runs)

    return [
        Row(
            f"replay {n:,} on reconnect, daemon running, with the console open "
            f"(overview every {POLL_S * 1000:g} ms, median {fetches:g} fetches/replay)",
            f"median {statistics.median(r.rate for r in open_):,.0f} events/s"
            f" (runs: {each(open_)})",
            f"console closed, interleaved: median {statistics.median(r.rate for r in bare):,.0f}"
            f" events/s (runs: {each(bare)})",
            f"{mid:.2f}x (pairs {min(ratios):.2f}-{max(ratios):.2f}x)",
            f"median pair within {TARGET_REPLAY_LOSS:.0%}",
            met(mid >= 1 - TARGET_REPLAY_LOSS),
        ),
        Row(
            "  (same runs) daemon CPU per replayed event, console open / closed",
            f"{cpu_of(open_):.0f} / {cpu_of(bare):.0f} us",
            "",
            f"{statistics.median(cpu):.2f}x (pairs {min(cpu):.2f}-{max(cpu):.2f}x)" if cpu else "-",
        ),
    ]


def counts(quick: bool) -> tuple[int, int, int, int]:
    """(incidents, events, replay events, requests per page)."""
    return (1_000, 10_000, 10_000, 50) if quick else (10_000, 100_000, 20_000, 200)


def rows(
    work: Path, *, quick: bool = False, replays: int = 7, rounds: int | None = None
) -> list[Row]:
    """Every figure of this bench (run_all.py calls this)."""
    incidents, events, replay_n, default_rounds = counts(quick)
    print(f"bench: store of {incidents:,} incidents / {events:,} events ...", file=sys.stderr)
    found = render_times(work, incidents, events, rounds or default_rounds)
    print(f"bench: store built in {found['built_s']:.1f} s", file=sys.stderr)
    out = render_rows(found, incidents, events)
    print("bench: daemon CPU per request ...", file=sys.stderr)
    out += cost_rows(fetch_costs(work, rounds or default_rounds))
    if replays <= 0:
        return out
    return out + replay_rows(replay_pairs(work, replay_n, replays), replay_n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (checks the bench)")
    parser.add_argument("--dir", type=Path, default=None, help="work dir on the disk to measure")
    parser.add_argument("--rounds", type=int, default=None, help="requests per page")
    parser.add_argument(
        "--replays", type=int, default=7, help="pairs of replays (with and without), 0: none"
    )
    parser.add_argument("--watch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fetch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.watch is not None:  # the Watcher's own process
        return watch(args.watch, args.report, fetch=args.fetch)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ntfy-intake-bench-console-", dir=args.dir) as tmp:
        found = rows(Path(tmp), quick=args.quick, replays=args.replays, rounds=args.rounds)
    print(render(found))
    print(f"\n({time.monotonic() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
