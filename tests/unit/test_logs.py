"""Repeated identical log lines are rate-limited: a flood costs a line a window, not megabytes."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog

from ntfy_intake.runtime import logs


def test_repeats_within_the_window_are_dropped_and_counted_on_the_next_line() -> None:
    now = {"t": 0.0}
    limiter = logs.RepeatLimiter(window=60.0, clock=lambda: now["t"])
    assert limiter.admit("a") == 0
    assert [limiter.admit("a") for _ in range(1000)] == [None] * 1000
    assert limiter.admit("b") == 0  # a different line is not held back
    now["t"] = 60.0
    assert limiter.admit("a") == 1000
    assert limiter.admit("a") is None


def test_distinct_lines_never_grow_the_limiter_without_bound() -> None:
    limiter = logs.RepeatLimiter(max_kinds=10)
    for n in range(1000):
        assert limiter.admit(str(n)) == 0
    assert len(limiter._seen) <= 10


def test_a_flood_of_identical_errors_writes_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdout", io.StringIO())
    logs.configure(json_output=True)
    try:
        log = structlog.get_logger("flood")
        for _ in range(5000):
            log.error("audit.write_failed", error="Too many open files")
        log.error("audit.write_failed", error="No space left on device")
        lines = [json.loads(line) for line in __import__("sys").stdout.getvalue().splitlines()]
    finally:
        structlog.reset_defaults()
    assert [line["error"] for line in lines] == ["Too many open files", "No space left on device"]


def test_stdlib_tracebacks_from_uvicorn_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    logs.configure(json_output=True)
    try:
        logger = logging.getLogger("uvicorn.error")
        with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
            for _ in range(200):
                try:
                    raise OSError(24, "Too many open files")
                except OSError:
                    logger.exception("Exception in ASGI application")
        assert len([r for r in caplog.records if r.name == "uvicorn.error"]) == 1
    finally:
        structlog.reset_defaults()
