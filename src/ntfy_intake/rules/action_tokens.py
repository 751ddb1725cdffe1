"""The action buttons' tokens (DESIGN.md section 13, "the same from the fallback topic"): what
an owner message on the ntfy fallback topic carries so that its "Ack" and "Silence 2h" buttons
can act without a session. Pure: the key, the clock reading and the token are arguments.

A token names one owner message (its `owner_outbox` key), one action and an expiry, and is
signed with HMAC-SHA256 under the store's action key (store/action_tokens.py):

    base64url(payload) "." base64url(mac)       payload = "1\\n<action>\\n<expires>\\n<key>"
                                                  or "2\\n<action>\\n<expires>\\n<version>\\n<key>"

(no padding; the mac is over a fixed label and the payload, so the key signs nothing else).
Version 2 also names the incident's version when the message was published: the firing its Ack
is about, so that an old notification cannot acknowledge a later firing (flow/owner_buttons.py).
Checked in this order, so nothing about a token is told before its mac is: the shape, the mac
(constant-time compare), the action it was made for against the button pressed, the expiry. A
token is used once: its id (`token_id`, the action and the key) is recorded with its effect
(store/action_tokens.py), so the same button pressed twice, or the notification replayed,
acts once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from typing import Literal

Action = Literal["ack", "silence_2h"]
ACTIONS: tuple[Action, ...] = ("ack", "silence_2h")
_BY_NAME: dict[str, Action] = {name: name for name in ACTIONS}
# The button's label, and what a Signal reply would have to say for the same effect.
LABELS: dict[Action, str] = {"ack": "Ack", "silence_2h": "Silence 2h"}
SILENCE_SPAN = 2 * 3600.0
# A button works this long after its message was published: long enough for a night's sleep,
# short enough that an old notification found on a lost phone acts on nothing.
TTL = 24 * 3600.0
KEY_BYTES = 32
MAX_TOKEN = 1024  # characters: a key is at most a few hundred; anything longer is not ours
_VERSION = "1"
_VERSIONED = "2"  # the payload also names the incident's version (module doc)
_LABEL = b"ntfy-intake owner action\n"
_MAC_BYTES = hashlib.sha256().digest_size

Refusal = Literal["malformed", "forged", "wrong_action", "expired"]


@dataclass(frozen=True, slots=True)
class Verified:
    """A token this daemon made, for the button pressed, not expired."""

    key: str  # the owner message it belongs to
    action: Action
    expires: int
    version: int | None = None  # the incident's version at publishing, when the token names it


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a token acts on nothing. `key` only for a token whose mac held (expired, or made for
    the other button): never a value read from an unverified token."""

    why: Refusal
    key: str | None = None


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes | None:
    if not text or not text.isascii() or not all(c.isalnum() or c in "-_" for c in text):
        return None
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _mac(secret: bytes, payload: bytes) -> bytes:
    return hmac.new(secret, _LABEL + payload, hashlib.sha256).digest()


def sign(
    secret: bytes,
    key: str,
    action: Action,
    now: float,
    ttl: float = TTL,
    *,
    version: int | None = None,
) -> str:
    """A token for `action` on the owner message `key`, good until `now + ttl`; `version`, the
    incident's version the message shows, is signed into it when given."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    if not key or "\n" in key:
        raise ValueError("an owner message key is one non-empty line")
    if version is None:
        payload = f"{_VERSION}\n{action}\n{int(now + ttl)}\n{key}".encode()
    else:
        payload = f"{_VERSIONED}\n{action}\n{int(now + ttl)}\n{int(version)}\n{key}".encode()
    return f"{_b64(payload)}.{_b64(_mac(secret, payload))}"


def verify(secret: bytes, token: str, pressed: str, now: float) -> Verified | Refused:
    """What `token` allows for the button `pressed` (an action name from the URL) at `now`."""
    token = token.strip()
    if not token or len(token) > MAX_TOKEN or token.count(".") != 1:
        return Refused("malformed")
    head, _, tail = token.partition(".")
    payload, mac = _unb64(head), _unb64(tail)
    if payload is None or mac is None or len(mac) != _MAC_BYTES:
        return Refused("malformed")
    if not hmac.compare_digest(mac, _mac(secret, payload)):
        return Refused("forged")
    # From here on the payload is one this daemon signed; a shape it would not sign is still
    # refused rather than trusted (an older version's token, say).
    try:
        version, action, expires_text, rest = payload.decode("utf-8").split("\n", 3)
    except (UnicodeDecodeError, ValueError):
        return Refused("malformed")
    key, incident_version = rest, None
    if version == _VERSIONED:
        version_text, _, key = rest.partition("\n")
        if not (version_text.isascii() and version_text.isdigit()):
            return Refused("malformed")
        incident_version = int(version_text)
    made_for = _BY_NAME.get(action)
    if (
        version not in (_VERSION, _VERSIONED)
        or made_for is None
        or not (expires_text.isascii() and expires_text.isdigit())
        or not key
    ):
        return Refused("malformed")
    if made_for != pressed:
        return Refused("wrong_action", key)
    expires = int(expires_text)
    if now > expires:
        return Refused("expired", key)
    return Verified(key, made_for, expires, incident_version)


def token_id(key: str, action: Action) -> str:
    """What a used token is recorded as: one use per message and button, whichever token of it
    (a message published twice carries two tokens with different expiries)."""
    return f"{action}:{key}"


def action_named(name: str) -> Action | None:
    """The action a button's URL names, or None for anything else."""
    return _BY_NAME.get(name)
