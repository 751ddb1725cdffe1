"""An unusable state directory stops `run` with exit 2 and one line naming the path."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from ntfy_intake.errors import ConfigError
from ntfy_intake.runtime import preflight

from ..conftest import CliRun


def run_daemon(cli_in_process: CliRun, state_dir: Path) -> subprocess.CompletedProcess[str]:
    """`run` refuses the state directory before any daemon starts: checked in-process."""
    env = {
        "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
        "NTFY_INTAKE_NTFY_TOPICS": "alerts",
        "NTFY_INTAKE_STATE_DIR": str(state_dir),
    }
    return cli_in_process("run", env=env)


def assert_one_line_exit_2(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in ("state.dir", *needles):
        assert needle in lines[0]


def test_state_dir_under_a_file_exits_2_with_one_line_naming_the_path(
    tmp_path: Path, cli_in_process: CliRun
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    state = blocker / "state"
    assert_one_line_exit_2(
        run_daemon(cli_in_process, state), str(state), f"is under a file ({blocker})"
    )


def test_state_dir_that_is_a_file_exits_2_with_one_line(
    tmp_path: Path, cli_in_process: CliRun
) -> None:
    state = tmp_path / "state"
    state.write_text("x")
    assert_one_line_exit_2(run_daemon(cli_in_process, state), f"{state} is a file")


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes anywhere; the monkeypatched test covers it"
)
def test_unwritable_state_dir_exits_2_with_one_line(tmp_path: Path, cli_in_process: CliRun) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o500)
    try:
        assert_one_line_exit_2(run_daemon(cli_in_process, state), str(state), "not writable")
    finally:
        state.chmod(0o700)


def test_state_dir_that_cannot_be_created_names_the_path_the_user_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    state = tmp_path / "var" / "lib" / "ntfy-intake"
    with pytest.raises(ConfigError) as caught:
        preflight.check_state_dir(state)
    text = str(caught.value)
    assert text.startswith(f"config error: state.dir: cannot create {state}: permission denied")
    assert f"on {tmp_path} as uid {os.geteuid()}" in text
    assert "install -d -m 700" in text and "\n" not in text


def test_state_dir_on_which_no_file_can_be_created_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(preflight.tempfile, "mkstemp", read_only)
    with pytest.raises(ConfigError, match=r"is not writable: read-only file system as uid \d+"):
        preflight.check_state_dir(tmp_path)


def test_a_usable_state_dir_is_created_0700_and_left_clean(tmp_path: Path) -> None:
    state = tmp_path / "a" / "state"
    preflight.check_state_dir(state)
    assert state.is_dir() and (state.stat().st_mode & 0o777) == 0o700
    assert list(state.iterdir()) == []
