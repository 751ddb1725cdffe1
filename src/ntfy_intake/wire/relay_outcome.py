"""What a relay attempt's answer means, when to try again, what was counted: pure (the loop is
flow/relay.py), beside `refusals.py`, which reads a refused subscribe the same way.

`classify` reads a status, the headers, the body (or the error when no response came) into an
`Outcome`; 2xx delivers (its `notify.text`, when the agent sent one, goes to the owner), 401, 408,
429 and 5xx retry (`Retry-After` honoured as a floor), any other 4xx is permanent. A reply is
made valid UTF-8 where it is decoded: no value a receiver sends can stop the relay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import httpx

from ntfy_intake.rules import backoff
from ntfy_intake.wire import jsonsafe

RETRY_BASE = 2.0
RETRY_CAP = 300.0


@dataclass(slots=True)
class RelayStats:
    """The relay's counters (status, metrics)."""

    attempts: int = 0
    delivered: int = 0
    retries: int = 0
    dead: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: Literal["delivered", "retry", "permanent"]
    detail: str
    status: int | None = None
    retry_after: float | None = None
    notify_text: str | None = None


def classify(
    status: int | None, headers: httpx.Headers | None, body: bytes, error: str | None, now: float
) -> Outcome:
    """What an attempt's result means. `status` is None when no response arrived."""
    if status is None:
        return Outcome("retry", error or "no response")
    if 200 <= status < 300:
        return Outcome("delivered", f"HTTP {status}", status, notify_text=_notify_text(body))
    retry_after = backoff.parse_retry_after(headers.get("Retry-After") if headers else None, now)
    if status in (401, 408, 429) or status >= 500:
        # 401: the receiver refused the signature or token. Its clock may not be synced yet or a
        # secret may be mid-rotation, both of which heal; `Relay` tells the owner once.
        return Outcome("retry", f"HTTP {status}", status, retry_after=retry_after)
    return Outcome("permanent", f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}", status)


def _notify_text(body: bytes) -> str | None:
    try:
        parsed = jsonsafe.loads(body) if body else None  # strings come back valid UTF-8
    except jsonsafe.BadJson:
        return None
    if not isinstance(parsed, dict):
        return None
    notify = parsed.get("notify")
    if isinstance(notify, dict) and isinstance(notify.get("text"), str) and notify["text"].strip():
        return str(notify["text"])
    return None


def retry_delay(
    attempt: int,
    retry_after: float | None,
    rng: Callable[[], float],
    *,
    base: float = RETRY_BASE,
) -> float:
    return backoff.delay(attempt - 1, base=base, cap=RETRY_CAP, rng=rng, retry_after=retry_after)
