"""Start-up memory: a library only one mode uses is not resident in every daemon (peak RSS < 80 MB,
issue 36; the figures in docs/performance.md, Memory)."""

from __future__ import annotations

import subprocess
import sys

DAEMON_IMPORTS = "import ntfy_intake.cli, ntfy_intake.runtime.daemon, ntfy_intake.flow.intake"


def loaded_after(code: str, modules: tuple[str, ...]) -> list[str]:
    probe = f"{code}; import sys; print(' '.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_a_daemon_without_websocket_replies_does_not_load_websockets() -> None:
    """Failure mode: websockets' 23 modules (~0.8 MiB resident) in every daemon, loaded at import
    by flow/owner_replies.py for the websocket receive mode that few configure."""
    if loaded_after("import websockets.asyncio.client", ("websockets",)) != ["websockets"]:
        raise AssertionError("precondition: the probe sees websockets when it is imported")
    assert loaded_after(DAEMON_IMPORTS, ("websockets",)) == []
