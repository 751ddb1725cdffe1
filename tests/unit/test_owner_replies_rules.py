"""Pure rules of the owner's replies (rules/owner_replies.py): what counts as a reply, who the
owner is, the command, and which message it answers. Shapes as signal-cli-rest-api serves them
(AsamK/signal-cli src/main/java/org/asamk/signal/json/JsonMessageEnvelope.java,
JsonDataMessage.java, JsonQuote.java)."""

from __future__ import annotations

from typing import Any

import pytest

from ntfy_intake.rules import owner_replies as r

OWNER = "+31600000001"
UUID = "0f3c1e4a-1b2c-4d5e-8f90-123456789abc"


def item(**envelope: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "source": OWNER,
        "sourceNumber": OWNER,
        "sourceUuid": UUID,
        "timestamp": 1_764_470_000_123,
        "dataMessage": {"timestamp": 1_764_470_000_123, "message": "ack"},
    }
    base.update(envelope)
    return {"envelope": base, "account": "+31600000000"}


def test_data_message_with_quote_is_read_with_its_identity() -> None:
    parsed = r.parse_item(
        item(dataMessage={"message": "ack", "quote": {"id": 42, "author": OWNER}})
    )
    assert parsed == r.Envelope(OWNER, UUID, 1_764_470_000_123, "ack", 42)


@pytest.mark.parametrize(
    "junk",
    [
        None,
        [],
        {"account": "x"},
        item(dataMessage=None),  # a receipt or typing notice has no dataMessage
        item(dataMessage={"message": None}),  # a reaction or an attachment alone
        item(timestamp="123"),
        item(timestamp=True),
        item(source=None, sourceNumber=None, sourceUuid=None),
    ],
)
def test_what_is_not_a_text_reply_is_not_taken_for_one(junk: Any) -> None:
    assert r.parse_item(junk) is None


def test_a_sender_known_only_by_uuid_is_the_owner_when_listed() -> None:
    parsed = r.parse_item(item(source=None, sourceNumber=None))
    assert parsed is not None and parsed.source == UUID
    assert r.is_owner(parsed, [UUID])
    assert not r.is_owner(parsed, [OWNER])


def test_a_stranger_or_a_group_id_is_never_the_owner() -> None:
    parsed = r.parse_item(item(source="+31699999999", sourceNumber="+31699999999", sourceUuid=None))
    assert parsed is not None
    assert not r.is_owner(parsed, [OWNER, "group.YWJjZA=="])


@pytest.mark.parametrize(
    ("text", "verb", "span", "problem"),
    [
        ("ack", "ack", None, False),
        ("ACK!", "ack", None, False),
        ("  Silence 2h please", "silence", 7200.0, False),
        ("silence", "silence", None, True),
        ("silence 3d", "silence", None, True),
        ("silence \x1b[31m2h", "silence", 7200.0, False),  # escapes stripped first
        ("unsilence", "unsilence", None, False),
        ("Details", "details", None, False),
        ("status", "status", None, False),
        ("help", "help", None, False),
        ("reboot the nas", "unknown", None, True),
        ("", "unknown", None, True),
    ],
)
def test_command_is_the_first_word_case_insensitive(
    text: str, verb: str, span: float | None, problem: bool
) -> None:
    command = r.parse_command(text)
    assert (command.verb, command.span, command.problem is not None) == (verb, span, problem)


def test_quote_wins_and_an_unknown_quote_matches_nothing() -> None:
    now = 10_000.0
    newest = ("notify:b", now - 10)
    assert r.match(7, "notify:a", newest, now) == r.Target("notify:a", "quote")
    assert r.match(7, None, newest, now) is None  # never guess past a quote


def test_unquoted_reply_takes_the_newest_message_of_the_last_hour_only() -> None:
    now = 10_000.0
    assert r.match(None, None, ("notify:b", now - 3600), now) == r.Target("notify:b", "newest")
    assert r.match(None, None, ("notify:b", now - 3601), now) is None
    assert r.match(None, None, None, now) is None


def test_confirmations_are_bounded_and_carry_no_controls() -> None:
    text = r.confirmation("details", "alerts:\x1b[2Jdisk", lines=["x" * 400] * 5)
    assert len(text) <= r.CONFIRMATION_LIMIT and "\x1b" not in text
    assert r.confirmation("help", None, problem="Nope").startswith("Nope. Reply to")
