"""The drill itself, short: a few kills (random and at every crash point), every fault, a fixed
seed. It must pass: nothing lost, nothing doubled, no duplicate effect at the receiver."""

from __future__ import annotations

import argparse
import io
import os
import random
import re
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest

from ntfy_intake import cli
from ntfy_intake.testbed import drill, drill_args, drill_parts, drill_plan, drill_store

from .. import engines


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may contain spaces, so split after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def value(table: str, label: str) -> str:
    match = re.search(rf"^  {re.escape(label)}\s+(.*?)\s*$", table, re.MULTILINE)
    assert match, f"no {label!r} row in:\n{table}"
    return match.group(1)


@pytest.mark.slow
def test_short_drill_passes_and_reports_zero_lost_and_doubled() -> None:
    out = io.StringIO()
    children_before = set(children_of(os.getpid()))
    code = drill.run(kills=5, seed=1129, duration=4.0, out=out, progress=None)
    table = out.getvalue()
    assert code == 0, table
    assert value(table, "lost") == "0"
    assert value(table, "double outcomes") == "0"
    assert value(table, "duplicate effects at the receiver") == "0"
    assert value(table, "verdict") == "PASS"
    assert value(table, "kills: random / by crash point").startswith("2 / 3")
    crash_points = value(table, "  crash points")
    for point in drill_parts.CRASH_POINTS:
        assert f"{point} 1" in crash_points, table
    requests, receipts = value(table, "triage requests / receipts").split(" / ")
    assert int(requests) > 0 and requests == receipts
    assert value(table, "fallback_400 / gap notices") == "1 / 0"
    # Nothing left behind: no child process, no temp dir.
    assert set(children_of(os.getpid())) - children_before == set()
    state_dir = re.search(r"^state dir: (\S+) ", table, re.MULTILINE)
    assert state_dir and not Path(state_dir.group(1)).exists()


@pytest.mark.slow
def test_short_drill_on_postgresql_passes_in_a_schema_of_its_own_dropped_after() -> None:
    """`drill --database DSN`: the daemon on PostgreSQL, in a drill_<random> schema the drill
    makes and drops; the table names the server without the DSN's password."""
    server = engines.server_dsn()
    if server is None:
        if os.environ.get("CI") == "true":
            pytest.fail(engines.unavailable())
        pytest.skip(engines.unavailable())
    secret = engines.with_password(server, "hunter2-drill")
    out = io.StringIO()
    code = drill.run(kills=5, seed=1129, duration=4.0, database=secret, out=out, progress=None)
    table = out.getvalue()
    assert code == 0, table
    assert value(table, "lost") == "0"
    assert value(table, "double outcomes") == "0"
    assert value(table, "duplicate effects at the receiver") == "0"
    assert value(table, "verdict") == "PASS"
    requests, receipts = value(table, "triage requests / receipts").split(" / ")
    assert int(requests) > 0 and requests == receipts
    assert "hunter2" not in table
    assert engines.drill_schema_dropped(server, table), "the drill's schema was not dropped"


def test_own_schema_names_itself_in_the_search_path() -> None:
    dsn = drill_store.with_schema("postgresql://u@h:5/d", "drill_ab")
    assert dsn == "postgresql://u@h:5/d?options=-csearch_path%3Ddrill_ab"
    assert drill_store.with_schema("postgresql://u@h/d?sslmode=disable", "s").endswith(
        "&options=-csearch_path%3Ds"
    )


def test_the_daemons_tcp_ports_are_read_from_proc() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            assert client.getsockname()[1] in drill_store.tcp_ports(os.getpid())


@pytest.mark.parametrize("kills", [0, 1, 3, 5, 20, 40])
def test_plan_has_the_requested_kills_and_every_fault(kills: int) -> None:
    plan = drill_plan.build_plan(kills, random.Random(kills), emulator=True)
    ends = Counter(p.end for p in plan)
    assert ends["kill"] + ends["crash"] == kills
    assert ends["term"] >= 1
    points = Counter(p.crash_at.partition(":")[0] for p in plan if p.crash_at)
    assert set(points) == set(drill_parts.CRASH_POINTS[: min(kills, 3)])
    assert plan[0].end != "crash" and not plan[0].before  # the first start has no cursor yet
    during = [f for p in plan for f in p.during]
    assert sorted(during) == sorted([*drill_plan.EMULATOR_DURING, *drill_plan.RECEIVER_DURING])
    assert all(not p.during for p in plan if p.end == "crash" or p.early)
    assert sorted(f for p in plan for f in p.before) == sorted(drill_plan.BEFORE_FAULTS)


def test_plan_against_a_real_server_skips_emulator_faults() -> None:
    plan = drill_plan.build_plan(6, random.Random(1), emulator=False)
    assert sorted(f for p in plan for f in p.during) == sorted(drill_plan.RECEIVER_DURING)
    assert not any(p.before for p in plan)


def test_cli_arguments_map_to_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    drill_args.add_arguments(parser)
    seen: dict[str, object] = {}
    monkeypatch.setattr(drill, "run", lambda **kw: seen.update(kw) or 0)
    token = tmp_path / "token"
    token.write_text("tk_secret\n")
    token.chmod(0o600)
    args = parser.parse_args(
        [
            "--kills",
            "7",
            "--seed",
            "3",
            "--ntfy-url",
            "https://ntfy.example",
            "--topic",
            "t",
            "--token-file",
            str(token),
            "--keep",
        ]
    )
    assert drill.main(args) == 0
    assert seen == {
        "kills": 7,
        "seed": 3,
        "duration": None,
        "ntfy_url": "https://ntfy.example",
        "topic": "t",
        "token": "tk_secret",
        "keep": True,
        "database": None,
        "out": sys.stdout,
        "progress": sys.stderr,
    }
    assert drill.main(parser.parse_args(["--ntfy-url", "https://ntfy.example"])) == 2
    assert drill.main(parser.parse_args(["--kills", "-1"])) == 2


def test_drill_takes_its_token_from_the_environment_and_refuses_a_readable_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    drill_args.add_arguments(parser)
    seen: dict[str, object] = {}
    monkeypatch.setattr(drill, "run", lambda **kw: seen.update(kw) or 0)
    real = ["--ntfy-url", "https://ntfy.example", "--topic", "t"]
    monkeypatch.setenv("NTFY_INTAKE_NTFY_TOKEN", "tk_from_env")
    assert drill.main(parser.parse_args(real)) == 0
    assert seen["token"] == "tk_from_env"
    monkeypatch.delenv("NTFY_INTAKE_NTFY_TOKEN")
    token = tmp_path / "token"
    token.write_text("tk_in_file\n")
    token.chmod(0o644)
    assert drill.main(parser.parse_args([*real, "--token-file", str(token)])) == 2
    assert "readable by group or others" in capsys.readouterr().err
    options = {o for action in parser._actions for o in action.option_strings}
    assert "--token" not in options  # no way to put the token itself in argv


def test_storage_faults_are_dispatched_by_the_cli_and_refuse_zero_rounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`drill --faults storage` goes to the storage drill (the kill drill no longer imports it)."""
    assert cli.main(["drill", "--faults", "storage", "--rounds", "0"]) == 2
    assert capsys.readouterr().err.strip() == "drill: --rounds must be at least 1"
