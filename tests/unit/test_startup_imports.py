"""Start-up imports: what the daemon never runs is not loaded on the way to subscribing."""

from __future__ import annotations

import subprocess
import sys

CLI_ONLY = ("click", "pygments", "rich")


def loaded_after(code: str) -> list[str]:
    probe = f"{code}; import sys; print(' '.join(m for m in {CLI_ONLY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_starting_the_daemon_does_not_load_httpx_command_line_client() -> None:
    """Failure mode: ~50-70 ms of every start spent importing click and pygments for `httpx.main`."""
    if "click" not in loaded_after("import httpx"):
        raise AssertionError("precondition: a bare `import httpx` loads click here (uvicorn's)")
    assert (
        loaded_after("import ntfy_intake.cli, ntfy_intake.runtime.daemon, ntfy_intake.flow.intake")
        == []
    )


def test_httpx_imported_first_is_left_as_it_is() -> None:
    assert "click" in loaded_after("import httpx, ntfy_intake; assert callable(httpx.main)")
