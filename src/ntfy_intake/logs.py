"""Operator logs: structlog to stdout, JSON when not on a terminal, console lines on one.

Every string value is stripped of control characters and ANSI sequences first: ntfy text is
untrusted and must never drive an operator's terminal or forge a log line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from ntfy_intake.sanitize import strip_control


def _sanitize(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in event_dict.items():
        if isinstance(value, str):
            event_dict[key] = strip_control(value)
    return event_dict


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
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _sanitize,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=False,
    )
