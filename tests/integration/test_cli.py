"""The command line as a user meets it: exit codes, one-line errors, the feed commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ntfy_intake.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, settings_for, wait_until

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["run", "status", "check", "redrive", "feed", "emulator", "receiver", "demo", "drill"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    return subprocess.run(
        [sys.executable, "-m", "ntfy_intake", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_and_is_in_the_readme(command: str) -> None:
    result = cli(command, "--help")
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
    env: dict[str, str], key: str
) -> None:
    result = cli("run", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in result.stderr


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


def test_missing_config_says_where_config_is_looked_for(tmp_path: Path) -> None:
    result = cli("run", env={"NTFY_INTAKE_STATE_DIR": str(tmp_path)})
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("config error: ntfy.url: required, and so is ntfy.topics")
    assert "--config" in line and "/etc/ntfy-intake/config.toml" in line


def test_status_without_state_names_the_path_and_the_config_options(tmp_path: Path) -> None:
    result = cli("status", env={"NTFY_INTAKE_STATE_DIR": str(tmp_path / "none")})
    assert result.returncode == 1
    assert str(tmp_path / "none" / "intake.sqlite3") in result.stderr
    assert "--config" in result.stderr and "Traceback" not in result.stderr


def test_several_config_errors_are_all_reported_one_line_each(tmp_path: Path) -> None:
    result = cli(
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
