"""Notices the owner reads: one line each, no control characters, keys stable per trouble."""

from __future__ import annotations

import json
import re

import pytest

from ntfy_intake.rules import notices
from ntfy_intake.rules.notices import Notice
from ntfy_intake.store import audit

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

ALL = [
    notices.fallback_400("abcDEF123456", "abcDEF123456", "40008: invalid since parameter"),
    notices.gap("abcDEF123456", "2026-11-30T01:00:00Z", "2026-11-30T03:00:00Z"),
    notices.latch("No space left on device", "boot1"),
    notices.intake_dead(300.0, "ConnectError: refused", "boot1:7"),
    notices.intake_recovered("boot1:9"),
    notices.dead_row("tri_abcDEF123456", "HTTP 400: bad request", 1),
    notices.login_throttled("192.168.1.50", 5, 60.0, "1796576417"),
    notices.login_throttled("*", 30, 60.0, "1796576417"),
]


@pytest.mark.parametrize("notice", ALL, ids=lambda n: n.notice)
def test_notice_text_is_one_clean_line_and_names_its_kind_in_the_key(notice: Notice) -> None:
    assert not CONTROL.search(notice.text)
    assert notice.key.startswith(f"{notice.notice}:")


def test_the_same_trouble_gets_the_same_key_so_it_is_sent_once() -> None:
    assert notices.gap("c1", "a", "b").key == notices.gap("c1", "x", "y").key
    assert notices.fallback_400("c1", "c1", "x").key != notices.fallback_400("c2", "c2", "x").key
    assert notices.latch("disk full", "boot1").key != notices.latch("disk full", "boot2").key


def test_gap_notice_carries_its_exact_window_for_the_audit_log() -> None:
    gap = notices.gap("c1", "2026-11-30T01:00:00Z", "2026-11-30T03:00:00Z")
    assert gap.fields == {
        "window_start": "2026-11-30T01:00:00Z",
        "window_end": "2026-11-30T03:00:00Z",
        "cursor": "c1",
    }
    assert "2026-11-30T01:00:00Z" in gap.text and "2026-11-30T03:00:00Z" in gap.text


def test_a_takeover_notices_audit_line_has_one_term_the_envelopes() -> None:
    """Kills a notice field named `term` beside the audit line's own envelope `term`: the line
    then held the key twice and a JSON reader kept the notice's string, hiding the term."""
    notice = notices.takeover("nas", "pi", 3, 2)
    record = audit.encode({"ts": "2026-12-01T00:00:00Z", "kind": "notice", **notice.fields})
    pairs = json.loads(audit.file_line(11, record, term=3), object_pairs_hook=lambda kv: kv)
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), keys
    assert dict(pairs)["term"] == 3
