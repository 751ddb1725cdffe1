"""ntfy-intake: exactly one recorded outcome per ntfy event, across any crash."""

import sys
import types

__version__ = "0.1.0"


def _without_httpx_cli() -> None:
    """httpx's package import loads its command-line client (`httpx._main`: click, rich and
    pygments when installed, 50-70 ms here, a fifth of the daemon's start-up) only to offer
    `httpx.main`. Nothing in this process runs that client, so a stand-in takes its place
    before httpx is first imported; an httpx already imported is left as it is."""
    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        return
    stand_in = types.ModuleType("httpx._main", "ntfy-intake does not load httpx's CLI")

    def main() -> None:
        raise SystemExit("httpx's command-line client is not loaded in this process")

    stand_in.main = main  # type: ignore[attr-defined]
    sys.modules["httpx._main"] = stand_in


_without_httpx_cli()
