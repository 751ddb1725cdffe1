"""The emulator-only admin endpoints, for when the emulator runs as a separate process.

The real ntfy has none of these. They live under /v1/emulator/ (`v1` is a disallowed topic name,
so nothing clashes) and exist only with `EmulatorConfig(admin=True)`:
GET messages[?topic=], GET subscribes, GET faults, POST faults (a JSON object, see
Faults.apply), POST prune, POST clock {"advance": seconds}.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ntfy_intake.emulator import wire

if TYPE_CHECKING:
    from ntfy_intake.emulator.exchange import Exchange

PREFIX = "/v1/emulator/"


async def handle(ex: Exchange) -> None:
    """Emulator-only endpoints (the real ntfy has none of these)."""
    hub = ex.hub
    route = (ex.method, ex.path.removeprefix(PREFIX))
    try:
        if route == ("GET", "messages"):
            await ex.respond_json(hub.messages(ex.params.query("topic")))
        elif route == ("GET", "subscribes"):
            await ex.respond_json(hub.subscribe_log())
        elif route == ("GET", "faults"):
            await ex.respond_json(hub.faults.snapshot())
        elif route == ("POST", "faults"):
            spec = json.loads(await ex.body() or b"{}")
            if not isinstance(spec, dict):
                raise TypeError("expected a JSON object")
            hub.faults.apply(spec)
            await ex.respond_json(hub.faults.snapshot())
        elif route == ("POST", "prune"):
            await ex.respond_json({"pruned": hub.prune()})
        elif route == ("POST", "clock"):
            spec = json.loads(await ex.body() or b"{}")
            hub.advance(float(spec.get("advance", 0)))
            await ex.respond_json({"now": hub.now()})
        else:
            raise wire.NOT_FOUND
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise wire.BAD_REQUEST.wrap(str(exc)) from None
