"""`drill --standby`, short: two nodes on one PostgreSQL, three faults against the leader (a fixed
seed: SIGTERM, kill -9 and, on a server of the test's own, an immediate restart; without one,
SIGSTOP instead). It must pass, and its table must carry every figure it promises."""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake import cli
from ntfy_intake.testbed import drill, drill_args
from ntfy_intake.testbed.drill_standby_parts import KINDS, LEASE_KINDS, Round, build_plan

from .. import engines
from .test_drill import children_of, value

ROOT = Path(__file__).resolve().parents[2]
SEED = 7
CRASH_BOUND = 3 + 1 + 5  # the drill's default lease: lease_ttl + renew_every + 5 s


@pytest.fixture
def own_server() -> Iterator[tuple[str, Path] | None]:
    """A throwaway PostgreSQL of this test's own (scripts/pg-cluster), since the restart fault
    restarts the whole server: (its DSN, its data dir), or None when none can be started."""
    directory = Path(tempfile.mkdtemp(prefix="ntfy-intake-standby-pg-"))
    script = str(ROOT / "scripts" / "pg-cluster")
    try:
        started = subprocess.run(
            [script, "start", str(directory)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        started = None
    try:
        if started is None or started.returncode != 0:
            yield None
        else:
            yield started.stdout.strip(), directory / "data"
    finally:
        if started is not None and started.returncode == 0:
            subprocess.run(
                [script, "stop", str(directory)], check=False, capture_output=True, timeout=120
            )
        shutil.rmtree(directory, ignore_errors=True)


def figures(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"\d+\.\d+", text)]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_standby_drill_of_three_rounds_passes_with_every_figure(
    own_server: tuple[str, Path] | None, capsys: pytest.CaptureFixture[str]
) -> None:
    if own_server is None:  # the shared test server: no restart fault against it
        server, pg_data = engines.server_dsn(), None
        assert server is not None  # the engine fixture skipped (or failed) without one
    else:
        server, pg_data = own_server
    plan = build_plan(3, random.Random(SEED), pg_restart=pg_data is not None, kinds=LEASE_KINDS)
    assert plan == (
        ["sigterm", "kill9", "pg_restart"] if pg_data else ["sigterm", "sigstop", "kill9"]
    )
    children_before = set(children_of(os.getpid()))
    argv = ["drill", "--standby", "--rounds", "3", "--seed", str(SEED), "--database", server]
    argv += ["--kinds", ",".join(LEASE_KINDS)]  # the lease's faults (the work's: _work.py)
    code = cli.main([*argv, *(["--pg-data", str(pg_data)] if pg_data else [])])
    table = capsys.readouterr().out
    assert code == 0, table
    assert value(table, "verdict") == "PASS"
    assert value(table, "fault rounds").startswith("3 of 3")
    assert value(table, "lost (pi / nas files)") == "0 / 0"
    assert value(table, "double outcomes (pi / nas files)") == "0 / 0"
    assert value(table, "published ids without an inbox row") == "0"
    assert value(table, "duplicate effects at the receiver") == "0"
    assert value(table, "journal rows of an older term after a newer term's first") == "0"
    requests, receipts = value(table, "triage requests / receipts").split(" / ")
    assert int(requests) > 0 and requests == receipts
    assert int(value(table, "events published").split()[0]) > 0
    for node in ("pi", "nas"):
        assert value(table, f"audit files of {node} == journal").startswith("equal above seq")
    # The process faults each end in a failover to the other node, with its takeover notice. A
    # PostgreSQL restart may end in one too: while the server is down no node renews, and on a
    # loaded machine the standby can be the first back to find the lease expired (lease_ttl 3s).
    failovers = int(value(table, "failovers (another node took a new term)").split()[0])
    process_faults = sum(k in ("kill9", "sigstop", "sigterm") for k in plan)
    assert process_faults <= failovers <= process_faults + plan.count("pg_restart"), table
    notices, taken = value(table, "takeover notices / terms seen taken from another node").split(
        " / "
    )
    assert notices == taken and int(taken) >= 2
    labels = {
        "sigterm": "SIGTERM (graceful)",
        "kill9": "kill -9",
        "sigstop": "SIGSTOP past the TTL",
    }
    labels["pg_restart"] = "PostgreSQL restart"
    for kind in plan:
        times = value(table, f"failover time, {labels[kind]} (p50 / max)")
        lease_p50, lease_max, event_p50, event_max = figures(times)[:4]
        assert 0 < lease_p50 <= lease_max and 0 < event_p50 <= event_max <= CRASH_BOUND, times
        assert lease_max < 2.0 if kind == "sigterm" else lease_max <= CRASH_BOUND, times
    if "sigstop" in plan:
        assert value(table, "old leader stood by after SIGCONT") == "1 / 1"
    assert value(table, "SIGTERM stops, exit 0") == "1 / 1"
    assert value(table, "final SIGTERM stops") in ("pi exit 0, nas exit 0", "nas exit 0, pi exit 0")
    # Nothing left behind: no process, no temp dir, no schema.
    assert set(children_of(os.getpid())) - children_before == set()
    dirs = re.search(r"^state dirs: (\S+), (\S+) ", table, re.MULTILINE)
    assert dirs and not Path(dirs.group(1)).exists() and not Path(dirs.group(2)).exists()
    assert engines.drill_schema_dropped(server, table), "the drill's schema was not dropped"


@pytest.mark.parametrize("rounds", [1, 3, 4, 5, 11, 50])
@pytest.mark.parametrize("restart", [True, False])
def test_the_plan_spreads_the_rounds_evenly_over_the_kinds(rounds: int, restart: bool) -> None:
    plan = build_plan(rounds, random.Random(rounds), pg_restart=restart)
    kinds = [k for k in KINDS if restart or k != "pg_restart"]
    counts = Counter(plan)
    assert len(plan) == rounds and set(counts) <= set(kinds)
    assert max(counts.values()) - min(counts.get(k, 0) for k in kinds) <= 1


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    drill_args.add_arguments(parser)
    return parser.parse_args(argv)


def test_standby_arguments_are_checked_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dsn = ["--database", "postgresql://u@127.0.0.1:1/d"]
    cases = {
        "needs --database DSN": ["--standby"],
        "bundled emulator": ["--standby", *dsn, "--ntfy-url", "https://n.example", "--topic", "t"],
        "--rounds must be at least 1": ["--standby", *dsn, "--rounds", "0"],
        "at least 3 x renew_every": ["--standby", *dsn, "--lease-ttl", "2", "--renew-every", "1"],
        "no such directory": ["--standby", *dsn, "--pg-data", str(tmp_path / "absent")],
    }
    for said, argv in cases.items():
        assert drill.main(parse(argv)) == 2, argv
        assert said in capsys.readouterr().err, argv
    assert parse(["--standby"]).faults == "standby"
    with pytest.raises(SystemExit) as refused:
        parse(["--standby", "--faults", "storage"])  # one kind of drill at a time
    assert refused.value.code == 2


def test_a_take_back_names_the_terms_it_came_after() -> None:
    """A work fault's round where the faulted node took the lease back says whether it took it
    straight back or after the other node's term lapsed (a CI run under load failed on one take
    back and its table could not tell which)."""
    straight = Round(0, "audit_full", "pi", 4, term_after=6, leader_after="nas", retook=True)
    straight.terms = [(5, "pi"), (6, "nas")]
    lapsed = Round(0, "route_cut", "pi", 4, term_after=5, leader_after="nas", retook=True)
    lapsed.terms = [(5, "nas"), (6, "pi"), (7, "nas")]
    handed = Round(0, "audit_full", "pi", 4, term_after=5, leader_after="nas", terms=[(5, "nas")])
    assert "pi took the lease back itself (terms after the fault: pi 5 -> nas 6)" in (
        straight.describe()
    )
    assert "(terms after the fault: nas 5 -> pi 6 -> nas 7)" in lapsed.describe()
    assert "took the lease back" not in handed.describe()
