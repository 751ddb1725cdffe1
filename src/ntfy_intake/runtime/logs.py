"""Operator logs: structlog to stdout, JSON when not on a terminal, console lines on one.

Every string value is stripped of control characters and ANSI sequences first: ntfy text is
untrusted and must never drive an operator's terminal or forge a log line.

Repeated identical lines are rate-limited (`RepeatLimiter`): the first of a kind is logged, the
same line again within `window` seconds is dropped and counted, and the next one after the window
carries `repeated=N`. A flood (a client hammering the HTTP surface, a disk that keeps failing)
then costs a line a minute, not hundreds of megabytes. The same applies to the standard-library
loggers uvicorn and asyncio write to, tracebacks included.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

from ntfy_intake.rules.sanitize import strip_control


def _sanitize(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in event_dict.items():
        if isinstance(value, str):
            event_dict[key] = strip_control(value)
    return event_dict


class RepeatLimiter:
    """Decides, per identical line, whether to emit it now and how many were dropped before."""

    def __init__(
        self,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_kinds: int = 1024,
    ) -> None:
        self.window = window
        self.clock = clock
        self.max_kinds = max_kinds
        self._seen: dict[str, tuple[float, int]] = {}  # line -> (window start, dropped)

    def admit(self, line: str) -> int | None:
        """None: drop this line. Otherwise emit it, noting this many dropped repeats."""
        now = self.clock()
        seen = self._seen.get(line)
        if seen is not None and now - seen[0] < self.window:
            self._seen[line] = (seen[0], seen[1] + 1)
            return None
        if len(self._seen) >= self.max_kinds:
            self._seen.clear()  # many distinct lines: forget, never grow without bound
        self._seen[line] = (now, 0)
        return 0 if seen is None else seen[1]


_IGNORED = frozenset({"timestamp", "repeated"})


def _repeat_key(event_dict: MutableMapping[str, Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in event_dict.items() if k not in _IGNORED))


def rate_limit(limiter: RepeatLimiter) -> Callable[..., MutableMapping[str, Any]]:
    """A structlog processor dropping repeats of an identical event within the window."""

    def processor(
        _: Any, __: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        dropped = limiter.admit(_repeat_key(event_dict))
        if dropped is None:
            raise structlog.DropEvent
        if dropped:
            event_dict["repeated"] = dropped
        return event_dict

    return processor


class RepeatFilter(logging.Filter):
    """The same for standard-library records (uvicorn, asyncio), keyed by logger and message."""

    def __init__(self, limiter: RepeatLimiter) -> None:
        super().__init__()
        self.limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        key = f"{record.name}|{record.levelno}|{record.getMessage()}|{type(exc).__name__}"
        dropped = self.limiter.admit(key)
        if dropped is None:
            return False
        if dropped:
            record.msg = f"{record.msg} (and {dropped} identical lines dropped)"
        return True


_stdlib_filter: RepeatFilter | None = None


_STDLIB_LOGGERS = ("uvicorn", "uvicorn.error", "asyncio")


def _limit_stdlib(limiter: RepeatLimiter) -> None:
    global _stdlib_filter  # noqa: PLW0603 - one filter per process, replaced on reconfigure
    for name in _STDLIB_LOGGERS:
        if _stdlib_filter is not None:
            logging.getLogger(name).removeFilter(_stdlib_filter)
    _stdlib_filter = RepeatFilter(limiter)
    for name in _STDLIB_LOGGERS:
        logging.getLogger(name).addFilter(_stdlib_filter)


def configure(*, level: int = logging.INFO, json_output: bool | None = None) -> None:
    if json_output is None:
        json_output = not sys.stdout.isatty()
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_output
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _sanitize,
            rate_limit(RepeatLimiter()),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=False,
    )
    _limit_stdlib(RepeatLimiter())
