"""The `ntfy-intake emulator` command's small options: ntfy's limits on unless
--no-rate-limits, auth with --token, the default port in --help, one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from ntfy_intake.cli import main

TOKEN = "tk_" + "a" * 29


def test_help_shows_the_default_port(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["emulator", "--help"])
    out = capsys.readouterr().out
    assert "port to listen on (default: 8786)" in out
    assert "--no-rate-limits" in out and "--token" in out


def test_bad_token_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["emulator", "--port", "0", "--token", "tk_short=alerts"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tk_" in err


@pytest.mark.slow
def test_token_turns_auth_on_and_limits_follow_the_flag() -> None:
    argv = ["emulator", "--port", "0", "--token", f"{TOKEN}=alerts,backups"]
    code = f"import sys; from ntfy_intake.cli import main; sys.exit(main({argv!r}))"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    ) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().split()[-1]
            with httpx.Client(base_url=url, timeout=3) as client:
                poll = {"poll": "1"}
                assert client.get("/alerts/json", params=poll).status_code == 403
                bearer = {"Authorization": f"Bearer {TOKEN}"}
                assert client.get("/alerts/json", params=poll, headers=bearer).status_code == 200
                statuses = [client.put("/x", content=b"m").status_code for _ in range(60)]
                assert statuses[-1] == 429  # ntfy's request limiter is on (58 left after 2)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=5) == 0
        finally:
            if process.poll() is None:
                process.kill()
