"""`http.token` strength, checked at start (settings/token.py): a token a person typed is
refused naming the key and the command that prints a good one, never the value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ntfy_intake import settings
from ntfy_intake.errors import ConfigError
from ntfy_intake.settings import token

BASE = {"NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9", "NTFY_INTAKE_NTFY_TOPICS": "alerts"}


@pytest.mark.parametrize(
    ("weak", "reason"),
    [
        ("1234", "shorter than 20"),
        ("x" * 19 + "", "shorter than 20"),
        ("12345678901234567890123", "only digits"),
        ("a" * 40, "only 1 different"),
        ("abababababababababababab", "only 2 different"),
        ("Ab1!Cd2@Ab1!Cd2@Ab1!Cd2@", "repeated"),
        ("change-me-to-a-long-random-string", "lowercase words"),
        ("correct.horse.battery.staple", "lowercase words"),
        ("MySuperPassword2024!!xyz", "placeholder"),
        ("CHANGEME_please_9f8a7b6c", "placeholder"),
        ("abcdefghijklmnopqrstuvwxyz0", "run"),
        ("1234567890abcdefghijZ", "run"),
        ("xQwErTy-9f8a7b6c5d4e3f2", "placeholder"),
    ],
)
def test_a_typed_http_token_is_refused_naming_why_never_the_token(weak: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings.load(None, BASE | {"NTFY_INTAKE_HTTP_TOKEN": weak})
    message = str(info.value)
    assert message.startswith("config error: http.token"), message
    assert reason in message
    assert "ntfy-intake token" in message
    assert weak not in message


@pytest.mark.parametrize(
    "good",
    [
        "tk_9f8a7b6c5d4e3f2a1b0c",
        "Q7mZ-3vKx_9pLr2WnT8s4Yb",
        "token_9f8a7b6c5d4e3f2a1b0c",  # a prefix that names what it is is fine
    ],
)
def test_a_random_token_of_20_or_more_characters_is_accepted(good: str) -> None:
    assert settings.load(None, BASE | {"NTFY_INTAKE_HTTP_TOKEN": good}).http.token == good


def test_what_the_token_command_prints_always_passes() -> None:
    for _ in range(2000):
        assert token.weakness(token.generate()) is None


def test_a_four_digit_http_token_stops_the_daemon_at_start_with_exit_2_and_one_line(
    tmp_path: Path,
) -> None:
    """Failure mode: `http.token = "1234"` accepted, then found by a guessing loop in 4.9 s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    env |= BASE | {"NTFY_INTAKE_HTTP_TOKEN": "1234", "NTFY_INTAKE_STATE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "http.token" in lines[0] and "ntfy-intake token" in lines[0]
    assert "1234" not in done.stderr + done.stdout


def test_the_token_command_prints_one_good_token() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "token"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    printed = done.stdout.strip()
    assert len(printed) == 43 and token.weakness(printed) is None
