"""The command line as a user meets it: exit codes, one-line errors, the feed commands.

A check that ends before any daemon, server or store would start (--help, bad settings, bad
arguments) runs the CLI in this process (`cli_in_process`); only the tests that read or write
the store run on both engines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from .. import engines, harness
from ..conftest import CliRun
from ..harness import DaemonThread, settings_for, wait_until

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [
    "run",
    "status",
    "check",
    "redrive",
    "feed",
    "silence",
    "emulator",
    "receiver",
    "signal-standin",
    "demo",
    "drill",
]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    if harness.DATABASE is not None:  # the test's store, as an agent on PostgreSQL is told it
        base["NTFY_INTAKE_STATE_DATABASE"] = harness.DATABASE
    return subprocess.run(
        [sys.executable, "-m", "ntfy_intake", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_and_is_in_the_readme(command: str, cli_in_process: CliRun) -> None:
    result = cli_in_process(command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"`{command}" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"NTFY_INTAKE_NTFY_TOPICS": "alerts"}, "ntfy.url"),
        (
            {
                "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
                "NTFY_INTAKE_NTFY_TOPICS": "alerts",
                "NTFY_INTAKE_NTFY_KEEPALIVE_TIMEOUT": "soon",
            },
            "ntfy.keepalive_timeout",
        ),
        (
            {
                "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
                "NTFY_INTAKE_NTFY_TOPICS": "alerts",
                "NTFY_INTAKE_CADENCE_DAILY_CAP": "-1",
            },
            "cadence.daily_cap",
        ),
    ],
)
def test_bad_config_stops_startup_with_exit_2_and_one_line_naming_the_key(
    env: dict[str, str], key: str, cli_in_process: CliRun
) -> None:
    result = cli_in_process("run", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in result.stderr


@pytest.mark.engines
def test_feed_commands_round_trip_a_recorded_alert(tmp_path: Path) -> None:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu:
        config = settings_for(emu.url, tmp_path, cadence_debounce="0s")
        assert cli(
            "feed", "catch-up", "--state-dir", str(tmp_path), "--handle", "triage"
        ).stdout.strip() in ("[]", "")
        with DaemonThread(config):
            emu.wait_for_subscribers(1)
            emu.publish("alerts", "disk \x1b[31mfull\x1b[0m", title="Disk")
            wait_until(
                lambda: json.loads(
                    cli(
                        "feed", "catch-up", "--state-dir", str(tmp_path), "--handle", "triage"
                    ).stdout
                    or "[]"
                ),
                timeout=15,
            )
    waited = cli(
        "feed", "wait", "--state-dir", str(tmp_path), "--handle", "triage", "--timeout", "1"
    )
    assert waited.returncode == 0
    wake = json.loads(waited.stdout)["wake_line"]
    assert "[untrusted]" in wake and "\x1b" not in wake and "full" not in wake  # no body in a wake
    (entry,) = json.loads(
        cli("feed", "catch-up", "--state-dir", str(tmp_path), "--handle", "triage").stdout
    )
    assert entry["channel"] == "triage" and entry["payload"]["events"][0]["title"] == "Disk"
    acked = cli(
        "feed",
        "ack",
        "--state-dir",
        str(tmp_path),
        "--handle",
        "triage",
        "--channel",
        "triage",
        "--seq",
        str(entry["seq"]),
    )
    assert json.loads(acked.stdout) == {"channel": "triage", "cursor": entry["seq"]}
    assert (
        json.loads(
            cli("feed", "catch-up", "--state-dir", str(tmp_path), "--handle", "triage").stdout
        )
        == []
    )
    timed_out = cli(
        "feed", "wait", "--state-dir", str(tmp_path), "--handle", "triage", "--timeout", "0.2"
    )
    assert (timed_out.returncode, timed_out.stdout.strip()) == (1, "null")


@pytest.mark.engines
def test_read_only_commands_work_without_ntfy_url(tmp_path: Path) -> None:
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        DaemonThread(settings_for(emu.url, tmp_path)),
    ):
        emu.wait_for_subscribers(1)
    only_state = {"NTFY_INTAKE_STATE_DIR": str(tmp_path)}
    status = cli("status", "--json", env=only_state)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["inbox"]["events"] == 0
    assert cli("check", env=only_state).returncode == 1  # the daemon stopped: not running
    assert "config error" not in cli("check", env=only_state).stderr
    redrive = cli("redrive", "--all", env=only_state)
    assert redrive.returncode == 0 and "redriven 0" in redrive.stdout
    caught_up = cli("feed", "catch-up", "--handle", "triage", env=only_state)
    assert caught_up.returncode == 0 and json.loads(caught_up.stdout) == []


def test_missing_config_says_where_config_is_looked_for(
    tmp_path: Path, cli_in_process: CliRun
) -> None:
    result = cli_in_process("run", env={"NTFY_INTAKE_STATE_DIR": str(tmp_path)})
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("config error: ntfy.url: required, and so is ntfy.topics")
    assert "--config" in line and "/etc/ntfy-intake/config.toml" in line


@pytest.mark.engines
def test_status_without_state_names_the_path_and_the_config_options(tmp_path: Path) -> None:
    result = cli("status", env={"NTFY_INTAKE_STATE_DIR": str(tmp_path / "none")})
    assert result.returncode == 1
    assert str(engines.target(tmp_path / "none", harness.DATABASE)) in result.stderr
    assert "password" not in result.stderr
    assert "--config" in result.stderr and "Traceback" not in result.stderr


def test_several_config_errors_are_all_reported_one_line_each(
    tmp_path: Path, cli_in_process: CliRun
) -> None:
    result = cli_in_process(
        "run",
        env={
            "NTFY_INTAKE_NTFY_URL": "ftp://x",
            "NTFY_INTAKE_NTFY_TOPICS": "alerts",
            "NTFY_INTAKE_CADENCE_DAILY_CAP": "-1",
            "NTFY_INTAKE_HTTP_LISTEN": "nowhere",
            "NTFY_INTAKE_STATE_DIR": str(tmp_path),
        },
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line.split(":")[1].split(" ")[1] for line in lines] == [
        "ntfy.url",
        "cadence.daily_cap",
        "http.listen",
    ]


def start(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start a foreground server command on a free port; return it and its banner line."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ntfy_intake", *args, "--port", "0"],
        env={**base, **(env or {})},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    banner = proc.stdout.readline()
    if not banner:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"{args[0]} printed no banner: {err}")
    return proc, banner


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("command", ["emulator", "receiver", "signal-standin"])
def test_busy_port_is_one_line_and_exit_2_not_a_traceback(command: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli(command, "--port", str(port), env={"XDG_STATE_HOME": str(tmp_path)})
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert f"cannot listen on 127.0.0.1:{port}: port {port} is already in use" in line
    assert "--port" in line


@pytest.mark.parametrize(
    ("command", "port"), [("emulator", "8786"), ("receiver", "8790"), ("signal-standin", "8791")]
)
def test_default_ports_are_in_help_and_the_emulator_keeps_off_8080(
    command: str, port: str, cli_in_process: CliRun
) -> None:
    assert f"(default: {port})" in cli_in_process(command, "--help").stdout


def test_signal_standin_command_accepts_a_send(tmp_path: Path) -> None:
    proc, banner = start("signal-standin")
    try:
        base = banner.split("POST ")[1].split("/v2/send")[0]
        sent = httpx.post(
            f"{base}/v2/send",
            json={"message": "hi", "number": "+4915100000000", "recipients": ["+4915111111111"]},
        )
        assert sent.status_code == 201
        assert httpx.get(f"{base}/_standin/messages").json()
    finally:
        stop(proc)


def test_emulator_token_option_turns_auth_on(tmp_path: Path) -> None:
    token = "tk_" + "e" * 29
    proc, banner = start("emulator", "--token", f"{token}=alerts")
    try:
        base = banner.strip().rsplit(" ", 1)[1]
        anonymous = httpx.get(f"{base}/alerts/json", params={"poll": "1"})
        assert anonymous.status_code in (401, 403)
        allowed = httpx.get(
            f"{base}/alerts/json",
            params={"poll": "1"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert allowed.status_code == 200
        other = httpx.get(
            f"{base}/backups/json",
            params={"poll": "1"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert other.status_code == 403
    finally:
        stop(proc)


def test_emulator_refuses_a_malformed_token_with_one_line(cli_in_process: CliRun) -> None:
    result = cli_in_process("emulator", "--port", "0", "--token", "secret")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("config error: --token:")


def test_receiver_keeps_its_receipts_in_the_state_home_not_the_current_directory(
    tmp_path: Path,
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc, banner = start("receiver", env={"XDG_STATE_HOME": str(tmp_path / "state")}, cwd=cwd)
    stop(proc)
    expected = tmp_path / "state" / "ntfy-intake" / "receiver.sqlite3"
    assert str(expected) in banner
    assert expected.exists()
    assert list(cwd.iterdir()) == []


@pytest.mark.engines
def test_feed_ack_defaults_to_the_triage_channel(tmp_path: Path) -> None:
    state = ["--state-dir", str(tmp_path)]
    assert cli("feed", "catch-up", *state, "--handle", "h").returncode == 0
    acked = cli("feed", "ack", *state, "--handle", "h", "--seq", "0")
    assert acked.returncode == 0, acked.stderr
    assert json.loads(acked.stdout) == {"channel": "triage", "cursor": 0}
