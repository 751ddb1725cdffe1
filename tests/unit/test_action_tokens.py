"""The fallback topic's action-button tokens and their `Actions` header (rules/action_tokens.py,
wire/owner_channels.py): pure, with an injected clock. Each test is named after the failure it
kills."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from ntfy_intake.rules import action_tokens as tokens
from ntfy_intake.rules.action_tokens import Refused, Verified
from ntfy_intake.testbed.emulator.actions import parse_actions
from ntfy_intake.wire.owner_channels import actions_header, button_url

SECRET = bytes(range(32))
OTHER_SECRET = bytes(range(1, 33))
KEY = "notify:tri_4f2a9c"
T0 = 1_764_470_000.0


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parts(token: str) -> tuple[bytes, bytes]:
    head, tail = token.split(".")
    return (
        base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)),
        base64.urlsafe_b64decode(tail + "=" * (-len(tail) % 4)),
    )


def test_a_token_verifies_for_its_button_until_its_expiry() -> None:
    token = tokens.sign(SECRET, KEY, "ack", T0)
    expires = int(T0 + tokens.TTL)
    assert tokens.verify(SECRET, token, "ack", T0) == Verified(KEY, "ack", expires)
    assert tokens.verify(SECRET, token, "ack", expires) == Verified(KEY, "ack", expires)
    assert tokens.verify(SECRET, f"  {token}\n", "ack", T0 + 60) == Verified(KEY, "ack", expires)


def test_expired_token_is_refused_and_names_its_message() -> None:
    token = tokens.sign(SECRET, KEY, "silence_2h", T0, ttl=3600)
    assert tokens.verify(SECRET, token, "silence_2h", T0 + 3601) == Refused("expired", KEY)


def test_token_signed_with_another_key_is_refused_as_forged() -> None:
    token = tokens.sign(OTHER_SECRET, KEY, "ack", T0)
    assert tokens.verify(SECRET, token, "ack", T0) == Refused("forged")


def test_token_for_another_messages_key_is_refused_as_forged() -> None:
    """The payload of one message's token with another message's key, the mac kept."""
    payload, mac = parts(tokens.sign(SECRET, KEY, "ack", T0))
    other = payload.replace(KEY.encode(), b"notify:tri_other")
    assert tokens.verify(SECRET, f"{b64(other)}.{b64(mac)}", "ack", T0) == Refused("forged")


def test_token_with_a_later_expiry_written_in_is_refused_as_forged() -> None:
    payload, mac = parts(tokens.sign(SECRET, KEY, "ack", T0))
    later = payload.replace(
        str(int(T0 + tokens.TTL)).encode(), str(int(T0 + 10 * tokens.TTL)).encode()
    )
    assert later != payload
    assert tokens.verify(SECRET, f"{b64(later)}.{b64(mac)}", "ack", T0) == Refused("forged")


def test_ack_token_pressed_as_silence_is_refused_as_wrong_action() -> None:
    token = tokens.sign(SECRET, KEY, "ack", T0)
    assert tokens.verify(SECRET, token, "silence_2h", T0) == Refused("wrong_action", KEY)


def test_expired_token_for_the_other_button_is_wrong_action_first() -> None:
    """The button is checked before the clock: the answer names the mistake the presser made."""
    token = tokens.sign(SECRET, KEY, "ack", T0, ttl=1)
    assert tokens.verify(SECRET, token, "silence_2h", T0 + 100) == Refused("wrong_action", KEY)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "   ",
        "no-dot-at-all",
        "a.b.c",
        ".",
        "abc.",
        ".abc",
        "ab$c.def",
        "a" * (tokens.MAX_TOKEN + 1),
        "é.é",
        f"{b64(b'1')}.{b64(b'short mac')}",
        "=\x00=.AAAA",
    ],
    ids=lambda t: repr(t[:20]),
)
def test_malformed_token_is_refused_without_a_key(token: str) -> None:
    assert tokens.verify(SECRET, token, "ack", T0) == Refused("malformed")


def test_signed_payload_of_an_unknown_shape_is_refused_not_trusted() -> None:
    """A payload this daemon would not sign (another version, an unknown action), signed with
    the right key, still acts on nothing."""
    for payload in (
        b"2\nack\n9999999999\nnotify:x",
        b"1\nreboot\n9999999999\nnotify:x",
        b"1\nack\nsoon\nnotify:x",
        b"1\nack\n9999999999\n",
        b"1\nack\n\xb2\nnotify:x",
    ):
        mac = hmac.new(SECRET, b"ntfy-intake owner action\n" + payload, hashlib.sha256).digest()
        assert tokens.verify(SECRET, f"{b64(payload)}.{b64(mac)}", "ack", T0) == Refused(
            "malformed"
        )


def test_sign_refuses_a_key_that_would_split_the_payload() -> None:
    with pytest.raises(ValueError):
        tokens.sign(SECRET, "notify:a\n1\nack", "ack", T0)
    with pytest.raises(ValueError):
        tokens.sign(SECRET, "", "ack", T0)


def test_one_use_per_message_and_button_whichever_token() -> None:
    assert tokens.token_id(KEY, "ack") == tokens.token_id(KEY, "ack")
    assert tokens.token_id(KEY, "ack") != tokens.token_id(KEY, "silence_2h")
    assert tokens.token_id(KEY, "ack") != tokens.token_id("notify:other", "ack")


def test_actions_header_parses_as_ntfy_reads_it() -> None:
    """What ntfy's parser (the emulator's, checked against a real server) makes of the header:
    two http buttons that POST the token as their body and clear the notification."""
    ack = tokens.sign(SECRET, KEY, "ack", T0)
    silence = tokens.sign(SECRET, KEY, "silence_2h", T0)
    base = "https://intake.home.lan/proxy,path;x"
    header = actions_header(
        [
            ("Ack", button_url(base, "ack"), ack),
            ("Silence 2h", button_url(base + "/", "silence_2h"), silence),
        ]
    )
    assert header is not None
    parsed = [a.to_dict() for a in parse_actions(header)]
    for one in parsed:
        del one["id"]
    assert parsed == [
        {
            "action": "http",
            "label": "Ack",
            "clear": True,
            "url": "https://intake.home.lan/proxy,path;x/v1/owner/buttons/ack",
            "method": "POST",
            "body": ack,
        },
        {
            "action": "http",
            "label": "Silence 2h",
            "clear": True,
            "url": "https://intake.home.lan/proxy,path;x/v1/owner/buttons/silence_2h",
            "method": "POST",
            "body": silence,
        },
    ]


@pytest.mark.parametrize(
    "url", ['http://pi.lan/"x', "http://pi.lan/\\", "http://pi.lan/\n", "http://pï.lan/"]
)
def test_url_ntfy_would_misread_gives_no_buttons_not_a_broken_publish(url: str) -> None:
    assert actions_header([("Ack", button_url(url, "ack"), "t.t")]) is None


def test_no_buttons_no_header() -> None:
    assert actions_header([]) is None
