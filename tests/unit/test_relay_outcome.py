"""The relay's classifier (wire/relay_outcome.py), pure: what a receiver's answer means, beside
what a refused subscribe means (test_refusals.py). The loop around it is tested over sockets in
tests/integration/test_relay_*.py."""

from __future__ import annotations

import httpx
import pytest

from ntfy_intake.wire.relay_outcome import RETRY_CAP, classify, retry_delay

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (200, "delivered"),
        (204, "delivered"),
        (401, "retry"),  # a receiver's clock not synced yet, or a secret mid-rotation: heals
        (408, "retry"),
        (429, "retry"),
        (500, "retry"),
        (503, "retry"),
        (400, "permanent"),
        (404, "permanent"),
        (422, "permanent"),
    ],
)
def test_each_status_is_delivered_retried_or_permanent(status: int, kind: str) -> None:
    assert classify(status, httpx.Headers(), b"", None, NOW).kind == kind


def test_no_response_is_a_retry_that_names_the_error() -> None:
    outcome = classify(None, None, b"", "timeout after 10s", NOW)
    assert (outcome.kind, outcome.detail, outcome.status) == ("retry", "timeout after 10s", None)


def test_retry_after_is_read_as_a_floor_on_the_wait() -> None:
    outcome = classify(503, httpx.Headers({"Retry-After": "120"}), b"", None, NOW)
    assert outcome.retry_after == 120.0
    assert retry_delay(1, outcome.retry_after, lambda: 0.0) >= 120.0


def test_the_wait_grows_with_the_attempt_and_stops_at_the_cap() -> None:
    waits = [retry_delay(attempt, None, lambda: 1.0) for attempt in (1, 2, 3, 30)]
    assert waits[0] < waits[1] < waits[2] <= waits[3] == RETRY_CAP


def test_a_delivered_reply_carries_the_agents_notify_text_and_no_other() -> None:
    reply = b'{"notify": {"text": "disk at 99%"}}'
    assert classify(200, None, reply, None, NOW).notify_text == "disk at 99%"
    for body in (b"", b"not json", b"[1]", b'{"notify": {"text": "  "}}', b'{"notify": 3}'):
        assert classify(200, None, body, None, NOW).notify_text is None


def test_a_reply_that_is_not_utf8_cannot_stop_the_relay() -> None:
    permanent = classify(400, None, b"\xff\xfe bad", None, NOW)
    assert permanent.kind == "permanent" and permanent.detail.startswith("HTTP 400: ")
    assert classify(200, None, b'{"notify": {"text": "a\\ud800b"}}', None, NOW).notify_text
