"""The audit log's time grid: `ts` as RFC 3339 UTC with milliseconds, and back.

Pure. The audit log stores `ts` with millisecond precision (`rfc3339` truncates), so cadence works
on that grid: `quantize(now)` is `now` as the log records it, and every window end is
`window_end(start, span) = quantize(start + span)`, a window covering `start <= t < end`. A
decision made live and the same question asked after a replay therefore see the same numbers.
"""

from __future__ import annotations

import functools
from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

_EARLIEST = 0.0  # 1970-01-01
_LATEST = 32_503_680_000.0  # 3000-01-01


# Every record of one batch shares its `now`, and a replay folds runs of equal `ts`: these pure
# conversions are cached so the fold costs dictionary lookups, not datetime arithmetic.
@functools.lru_cache(maxsize=256)  # a batch's records all share one timestamp
def rfc3339(ts: float) -> str:
    """`ts` as the audit log writes it: RFC 3339 UTC, milliseconds (`parse_ts` reads it back)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@functools.lru_cache(maxsize=1024)
def quantize(now: float) -> float:
    """`now` as the audit log records it: `parse_ts(rfc3339(now)) == quantize(now)`."""
    moment = datetime.fromtimestamp(now, UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000).timestamp()


def parse_ts(value: object) -> float | None:
    """An RFC 3339 `ts` back to unix time; None when it is not one (no offset, garbage)."""
    if not isinstance(value, str):
        return None
    return _parse_ts(value)


@functools.lru_cache(maxsize=1024)
def _parse_ts(value: str) -> float | None:
    try:
        moment = datetime.fromisoformat(value)
        if moment.tzinfo is None:
            return None
        ts = moment.timestamp()
        if not _EARLIEST <= ts <= _LATEST:
            return None
        return quantize(ts)  # a no-op for what rfc3339 wrote
    except (ValueError, OverflowError, OSError):
        return None


def window_end(start: float, span: float) -> float:
    """The first instant outside the window [start, start + span), on the millisecond grid."""
    return quantize(start + span)


def local_day(ts: float, timezone: str) -> date:
    return datetime.fromtimestamp(ts, ZoneInfo(timezone)).date()
