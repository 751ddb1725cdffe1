"""The owner console (DESIGN.md section 10): a web page on the daemon's HTTP surface.

`routes(Config(...))` gives the Starlette routes under `/console` (none without `http.token`);
`Actions` is what the daemon lends it to change things (silences, redrives); `api_routes` the
bearer-token JSON endpoints the `silence` CLI uses while the daemon runs.
"""

from __future__ import annotations

from ntfy_intake.surfaces.console.actions import Actions
from ntfy_intake.surfaces.console.api import api_routes
from ntfy_intake.surfaces.console.app import Config, routes

__all__ = ["Actions", "Config", "api_routes", "routes"]
