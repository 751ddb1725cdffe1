"""What the owner-sender tests share (tests/integration/test_owner*.py): the numbers, a clock set
by hand, and a run of senders over one store, one audit log and one HTTP client."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import audit, db

SENDER = "+31600000000"
OWNER = "+31600000001"
PARTNER = "+31600000002"
AUDIT_TIME = 1_764_470_000.0


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


Scenario = Callable[[Callable[..., OwnerSender]], Awaitable[None]]


def run(
    conn: db.Connection,
    tmp_path: Path,
    owner: OwnerSettings,
    scenario: Scenario,
    *,
    ntfy_url: str = "http://127.0.0.1:9",
    transport: httpx.AsyncBaseTransport | None = None,
    **defaults: Any,
) -> None:
    """Run `scenario(make)`; `make(**overrides)` builds a sender (a new one = a restart)."""

    async def main() -> None:
        with audit.AuditLog(tmp_path / "audit", lambda: AUDIT_TIME) as log:

            async def flush() -> bool:
                audit.flush(conn, log)
                return True

            async with httpx.AsyncClient(transport=transport) as client:

                def make(**overrides: Any) -> OwnerSender:
                    kwargs: dict[str, Any] = {
                        "run_db": db.run_inline,
                        "owner": owner,
                        "ntfy_url": ntfy_url,
                        "ntfy_token": None,
                        "clock": Clock(),
                        "flush_audit": flush,
                        "timeout": 2.0,
                        "rng": lambda: 0.0,
                        "retry_base": 2.0,
                        **defaults,
                        **overrides,
                    }
                    return OwnerSender(conn, client, **kwargs)

                await scenario(make)

    asyncio.run(main())
