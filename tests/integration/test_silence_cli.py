"""`ntfy-intake silence add|list|end` as a user meets it, against the real daemon over loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake.store import db
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from .. import harness
from ..harness import (
    DaemonThread,
    audit_records,
    daemon_process,
    env_for,
    query,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.engines

TOKEN = "silence-cli-token-7Hq2Xv9Lp4"


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    return subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "silence", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def snapshot_port(state: Path) -> int | None:
    if harness.DATABASE is None and not (state / "intake.sqlite3").exists():
        return None
    try:
        rows = query(state, "SELECT value FROM kv WHERE name = 'health'")
    except db.ERRORS:  # the store is still being made
        return None
    for (value,) in rows:
        port = json.loads(value).get("http_port")
        if isinstance(port, int):
            return port
    return None


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, "no error line"
    return lines[-1]


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emulator:
        yield emulator


@pytest.fixture
def running(emu: NtfyEmulator, tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        overrides = {"http_token": TOKEN, "relay_url": triage.url, "cadence_debounce": "0s"}
        with DaemonThread(settings_for(emu.url, state, **overrides)):
            wait_until(lambda: snapshot_port(state), what="the health snapshot's http_port")
            yield env_for(emu.url, state, **overrides), state


def test_silence_added_by_the_cli_suppresses_the_next_owner_message_and_can_be_ended(
    running: tuple[dict[str, str], Path], emu: NtfyEmulator
) -> None:
    env, state = running
    made = cli(env, "add", "--topic", "alerts", "--for", "2h", "--reason", "disk swap")
    assert made.returncode == 0, made.stderr
    assert "silenced: sil_" in made.stdout and "'alerts'" in made.stdout
    listed = cli(env, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (item,) = json.loads(listed.stdout)
    assert (item["scope"], item["target"], item["reason"]) == ("topic", "alerts", "disk swap")
    assert 7000 < item["remaining_s"] <= 7200
    emu.publish("alerts", "disk failing", title="Disk", priority=5)
    wait_until(
        lambda: (
            query(state, "SELECT state, last_error FROM owner_outbox WHERE kind = 'triage'")
            == [("suppressed", "silenced")]
        ),
        what="the owner message suppressed as silenced",
    )
    ended = cli(env, "end", item["id"])
    assert ended.returncode == 0 and item["id"] in ended.stdout, ended.stderr
    assert cli(env, "list").stdout.strip() == "no silences hold"
    again = cli(env, "end", item["id"])
    assert "no such silence holds" in one_line_error(again, 1)


def test_silence_on_an_incident_key_is_listed_with_its_scope(
    running: tuple[dict[str, str], Path],
) -> None:
    env, _ = running
    made = cli(env, "add", "--incident", "alerts:disk", "--for", "30m")
    assert made.returncode == 0, made.stderr
    assert "incident 'alerts:disk'" in cli(env, "list").stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["add", "--topic", "alerts"], "--for"),
        (["add", "--topic", "alerts", "--for", "2 hours"], "for: a duration"),
        (["add", "--topic", "alerts", "--for", "25h"], "between 1m and 24h"),
        (["add", "--topic", "alerts", "--for", "10s"], "between 1m and 24h"),
        (["add", "--topic", "a", "--incident", "b", "--for", "2h"], "not allowed with"),
        (["add", "--for", "2h"], "--topic --incident"),
        (["add", "--topic", "   ", "--for", "2h"], "target"),
        (["end", "../../etc"], "not a silence id"),
    ],
)
def test_silence_bad_input_is_exit_2_with_a_clear_line_and_no_traceback(
    running: tuple[dict[str, str], Path], args: list[str], says: str
) -> None:
    env, _ = running
    assert says in one_line_error(cli(env, *args))
    assert json.loads(cli(env, "list", "--json").stdout) == []  # nothing was made


def test_silence_with_a_wrong_token_is_refused_with_exit_2_and_makes_nothing(
    running: tuple[dict[str, str], Path],
) -> None:
    env, _ = running
    wrong = {**env, "NTFY_INTAKE_HTTP_TOKEN": "not-the-token-3Rm8Kc1Zw6"}
    line = one_line_error(cli(wrong, "add", "--topic", "alerts", "--for", "2h"))
    assert "http.token does not match" in line
    assert json.loads(cli(env, "list", "--json").stdout) == []


def test_silence_without_a_token_configured_says_so_with_exit_2(
    running: tuple[dict[str, str], Path],
) -> None:
    env, _ = running
    bare = {k: v for k, v in env.items() if k != "NTFY_INTAKE_HTTP_TOKEN"}
    assert "http.token is not set" in one_line_error(cli(bare, "list"))


def test_silence_when_the_daemon_never_ran_refuses_with_exit_2(tmp_path: Path) -> None:
    env = env_for("http://127.0.0.1:9", tmp_path / "state", http_token=TOKEN)
    line = one_line_error(cli(env, "add", "--topic", "alerts", "--for", "2h"))
    assert line.endswith("the daemon is not running; silences are made through it")


def test_silence_after_a_graceful_stop_refuses_instead_of_writing_behind_its_back(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with DaemonThread(settings_for(emu.url, state, http_token=TOKEN)):
        wait_until(lambda: snapshot_port(state), what="the health snapshot's http_port")
    env = env_for(emu.url, state, http_token=TOKEN)
    line = one_line_error(cli(env, "add", "--topic", "alerts", "--for", "2h"))
    assert "the daemon is not running" in line
    assert not [r for r in audit_records(state) if r["kind"] == "silence"]


def test_silence_right_after_kill_9_refuses_although_the_snapshot_is_still_fresh(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    env = env_for(emu.url, state, http_token=TOKEN)
    with daemon_process(env) as proc:
        wait_until(lambda: snapshot_port(state), what="the health snapshot's http_port")
        assert cli(env, "list").returncode == 0
        proc.kill()
        proc.wait(timeout=10)
        line = one_line_error(cli(env, "add", "--topic", "alerts", "--for", "2h"))
    assert "the daemon is not running" in line
