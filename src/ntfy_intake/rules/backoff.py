"""Pure retry timing shared by intake reconnects and relay attempts.

Hand-written rather than tenacity/stamina: both loops persist or supervise their own attempt
counters (the relay stores them in the outbox row so backoff survives restarts, and intake
reconnects forever by design), so all we need is the arithmetic, with randomness and time
passed in so tests are exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from email.utils import parsedate_to_datetime


def delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    rng: Callable[[], float],
    retry_after: float | None = None,
) -> float:
    """Capped exponential backoff with equal jitter; never shorter than the server's Retry-After."""
    ceiling = min(cap, base * (2.0 ** min(attempt, 62)))
    jittered = ceiling / 2 + rng() * ceiling / 2
    return max(jittered, retry_after or 0.0)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Retry-After as seconds from `now` (wall clock): delta-seconds or an HTTP date."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - now
    if math.isnan(seconds) or seconds < 0:  # garbage or in the past: retry without waiting
        return 0.0
    return min(seconds, 24 * 3600.0)
