"""The buttons' tokens attacked as a hostile network would (rules/action_tokens.py): the
incident version a token names, the payload shapes around it, the Actions header. Pure, the
clock injected.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from ntfy_intake.rules import action_tokens as tokens
from ntfy_intake.rules.action_tokens import Refused, Verified
from ntfy_intake.testbed.emulator.actions import parse_actions
from ntfy_intake.wire.owner_channels import actions_header, button_url

SECRET = b"k" * tokens.KEY_BYTES
KEY = "notify:tri_0123456789"
T0 = 1_764_470_000.0


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def signed(payload: bytes) -> str:
    mac = hmac.new(SECRET, b"ntfy-intake owner action\n" + payload, hashlib.sha256).digest()
    return f"{b64(payload)}.{b64(mac)}"


def test_incident_version_survives_the_round_trip() -> None:
    """Failure mode: the firing a button was made for is lost on the way, so its Ack acts on
    whichever firing the incident is in when pressed."""
    token = tokens.sign(SECRET, KEY, "ack", T0, version=7)
    expires = int(T0 + tokens.TTL)
    assert tokens.verify(SECRET, token, "ack", T0) == Verified(KEY, "ack", expires, 7)


def test_incident_version_cannot_be_moved_without_the_key() -> None:
    """Failure mode: a holder of an old token rewrites its version to the current firing's and
    acknowledges a firing the owner never saw."""
    token = tokens.sign(SECRET, KEY, "ack", T0, version=1)
    head, tail = token.split(".")
    payload = base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))
    moved = payload.replace(b"\n1\nnotify:", b"\n3\nnotify:")
    assert moved != payload
    assert tokens.verify(SECRET, f"{b64(moved)}.{tail}", "ack", T0) == Refused("forged")


@pytest.mark.parametrize(
    "payload",
    [
        b"2\nack\n9999999999\nnotify:x",  # no version line: the key taken for one
        b"2\nack\n9999999999\n-1\nnotify:x",
        b"2\nack\n9999999999\n\xd9\xa3\nnotify:x",  # a non-ASCII digit
        b"2\nack\n9999999999\n1\n",
        b"3\nack\n9999999999\n1\nnotify:x",
    ],
)
def test_signed_versioned_payload_of_a_wrong_shape_is_refused(payload: bytes) -> None:
    assert tokens.verify(SECRET, signed(payload), "ack", T0) == Refused("malformed")


@pytest.mark.parametrize(
    "public_url",
    [
        "https://intake.example",
        "https://intake.example/",
        "https://intake.example/a,b;c=d/'q'/",
        "http://[fe80::1%25eth0]:8788/p/",
        "https://intake.example:8443/x%22y",
    ],
)
def test_actions_header_is_read_back_by_ntfys_parser_exactly(public_url: str) -> None:
    """Failure mode: a separator in http.public_url (comma, semicolon, `=`, a quote of the other
    kind) ends a term of ntfy's simple form, and the app POSTs somewhere else."""
    buttons = [
        (
            tokens.LABELS[action],
            button_url(public_url, action),
            tokens.sign(SECRET, KEY, action, T0, version=4),
        )
        for action in tokens.ACTIONS
    ]
    header = actions_header(buttons)
    assert header is not None
    read = parse_actions(header)
    assert [(a.action, a.label, a.url, a.method, a.body, a.clear) for a in read] == [
        ("http", label, url, "POST", token, True) for label, url, token in buttons
    ]
