"""Pure decisions of the owner sender: answer classification, failed recipients, text, headers."""

from __future__ import annotations

import json
import unicodedata

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.wire.owner_channels import (
    classify_ntfy,
    classify_signal,
    failed_recipients,
    ntfy_headers,
    prepare_text,
    redact,
    retry_delay,
)

A, B = "+31600000001", "+31600000002"
GROUP = "group.Zm9vYmFy"


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_201_without_errors_is_sent_for_all() -> None:
    outcome = classify_signal(201, None, body({"timestamp": "1"}), None, 0.0, [A, B])
    assert (outcome.kind, outcome.failed) == ("sent", ())


def test_201_listing_one_failed_recipient_is_partial_for_that_one_only() -> None:
    answer = body({"timestamp": "1", "errors": [{"recipient": B, "error": "UntrustedIdentity"}]})
    outcome = classify_signal(201, None, answer, None, 0.0, [A, B])
    assert (outcome.kind, outcome.failed) == ("partial", (B,))
    assert B not in outcome.detail


def test_201_listing_every_recipient_is_a_retry_for_all() -> None:
    answer = body({"errors": [{"recipient": A}, {"recipient": B}]})
    outcome = classify_signal(201, None, answer, None, 0.0, [A, B])
    assert (outcome.kind, outcome.failed) == ("retry", (A, B))


def test_signal_cli_results_shape_is_understood() -> None:
    answer = body(
        {
            "timestamp": 1,
            "results": [
                {"recipientAddress": {"uuid": "u-1", "number": A}, "type": "SUCCESS"},
                {"recipientAddress": {"uuid": "u-2", "number": B}, "type": "IDENTITY_FAILURE"},
            ],
        }
    )
    assert failed_recipients(answer, [A, B]) == (B,)


def test_unidentifiable_failure_counts_against_groups_else_everyone() -> None:
    stranger = body({"errors": [{"recipient": "+49000000009"}]})
    assert failed_recipients(stranger, [A, GROUP]) == (GROUP,)
    assert failed_recipients(stranger, [A, B]) == (A, B)
    assert failed_recipients(body({"errors": ["weird"]}), [A]) == (A,)


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", body({"errors": None})])
def test_unparseable_201_body_is_sent(raw: bytes) -> None:
    assert classify_signal(201, None, raw, None, 0.0, [A]).kind == "sent"


@pytest.mark.parametrize(
    ("status", "kind"),
    [(408, "retry"), (429, "retry"), (500, "retry"), (503, "retry"), (400, "permanent"),
     (401, "permanent"), (404, "permanent"), (302, "permanent")],
)  # fmt: skip
def test_signal_status_classes(status: int, kind: str) -> None:
    assert classify_signal(status, None, b"", None, 0.0, [A]).kind == kind


def test_no_response_is_an_ambiguous_retry() -> None:
    outcome = classify_signal(
        None, None, b"", "timeout (ReadTimeout): may have been sent", 0.0, [A]
    )
    assert (outcome.kind, outcome.status) == ("retry", None)


def test_429_carries_retry_after() -> None:
    headers = httpx.Headers({"Retry-After": "30"})
    outcome = classify_signal(429, headers, b"", None, 0.0, [A])
    assert outcome.retry_after == 30.0
    assert retry_delay(1, outcome.retry_after, lambda: 0.0, base=0.01) == 30.0


def test_400_detail_carries_the_error_message() -> None:
    outcome = classify_signal(400, None, body({"error": "Failed: bad"}), None, 0.0, [A])
    assert outcome.detail == "HTTP 400: Failed: bad"


@pytest.mark.parametrize(
    ("status", "kind"),
    [(200, "sent"), (429, "retry"), (502, "retry"), (400, "permanent"), (403, "permanent")],
)
def test_ntfy_status_classes(status: int, kind: str) -> None:
    assert classify_ntfy(status, None, b"", None, 0.0).kind == kind
    assert classify_ntfy(None, None, b"", "ConnectError", 0.0).kind == "retry"


def test_retry_delay_is_capped_exponential_with_jitter() -> None:
    assert [retry_delay(n, None, lambda: 0.0, base=2.0) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert retry_delay(1, None, lambda: 1.0, base=2.0) == 2.0
    assert retry_delay(50, None, lambda: 1.0, base=2.0) == 300.0


@pytest.mark.parametrize(
    ("kind", "topic", "priority"),
    [("notice", "gap", "5"), ("notice", "latch", "5"), ("notice", "intake_dead", "5"),
     ("notice", "fallback_400", "4"), ("notice", "dead_row", "4"), ("triage", "triage", "4")],
)  # fmt: skip
def test_ntfy_headers_priority_and_title(kind: str, topic: str, priority: str) -> None:
    headers = ntfy_headers(kind, topic, None)
    assert headers["Priority"] == priority
    assert headers["Title"] == f"ntfy-intake: {topic}"
    assert "Authorization" not in headers


def test_ntfy_headers_are_ascii_and_carry_the_token() -> None:
    headers = ntfy_headers("notice", "g\u202eap\r\nX-Evil: 1", "tk_x")
    assert headers["Authorization"] == "Bearer tk_x"
    assert all(v.isascii() and "\n" not in v and "\r" not in v for v in headers.values())


def test_prepare_text_strips_controls_keeps_lines() -> None:
    raw = "\x1b[1mA\x1b[0m\tb\r\nc\x00\x9b31m\u202ed\u2028e  \n\n"
    assert prepare_text(raw) == "A b\ncd\ne"


def test_prepare_text_never_empty_and_cuts() -> None:
    assert prepare_text("\x1b[0m\x00 ") == "(empty message)"
    cut = prepare_text("x" * 5000)
    assert len(cut) == 2000 and cut.endswith("…")
    wide = prepare_text("\U0001f525" * 1500)  # 4 bytes each
    assert len(wide.encode()) <= 3900 and wide.endswith("…")


@given(st.text(max_size=3000))
def test_prepare_text_output_is_always_safe(text: str) -> None:
    out = prepare_text(text)
    assert 0 < len(out) <= 2000 and len(out.encode("utf-8")) <= 3900
    for char in out:
        assert char == "\n" or unicodedata.category(char) not in ("Cc", "Cs"), repr(char)
        assert (
            char not in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
        )


def test_redact_removes_numbers_groups_uuids_urls() -> None:
    text = (
        f"untrusted identity for {A} in {GROUP} "
        "(6829c2ae-bb7b-4642-b2a7-fb0d502e188a) at http://user:pw@signal:8080/v2/send; 4915112345678"
    )
    out = redact(text, [A])
    for secret in (A, GROUP, "6829c2ae", "pw@", "4915112345678"):
        assert secret not in out
    assert redact("HTTP 503 (Retry-After 30s)") == "HTTP 503 (Retry-After 30s)"
