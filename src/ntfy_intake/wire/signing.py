"""Standard Webhooks signatures for triage deliveries (https://www.standardwebhooks.com/).

Headers: `webhook-id` (the delivery key), `webhook-timestamp` (Unix seconds), `webhook-signature`
(`v1,<base64 HMAC-SHA256 over "<id>.<timestamp>.<body>">`, several separated by spaces while a
secret is rotated). Secrets are `whsec_` + base64 of 24-64 random bytes.

The HMAC itself is the `standardwebhooks` package's `Webhook.sign`. Its `verify` is not used by
the reference receiver: it reads the wall clock with a fixed 5-minute tolerance (tests could not
inject time) and raises ValueError, binascii.Error or UnicodeDecodeError, not its own error, on a
malformed signature header or a non-UTF-8 body, which a careless caller turns into a 500. `verify`
here parses every header defensively, takes `now` and a tolerance, and answers a reason or None.

Pure: no I/O, time is passed in.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
DEFAULT_TOLERANCE = (
    300.0  # seconds either side of the receiver's clock, as the specification suggests
)
_MAX_SIGNATURES = 8


class SecretError(ValueError):
    """The text is not a usable `whsec_` secret; the message never contains the secret."""


def parse_secret(text: str) -> bytes:
    """The key bytes of a `whsec_<base64>` secret, strictly decoded (no silently dropped chars)."""
    if not text.startswith(PREFIX):
        raise SecretError(f"must start with {PREFIX!r} followed by base64")
    encoded = text[len(PREFIX) :]
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise SecretError(f"the part after {PREFIX!r} is not valid base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise SecretError(
            f"must decode to {MIN_SECRET_BYTES}-{MAX_SECRET_BYTES} bytes, got {len(key)}"
        )
    return key


def new_secret(random_bytes: bytes) -> str:
    """A secret in the wire form, from 24-64 random bytes (e.g. `secrets.token_bytes(32)`)."""
    if not MIN_SECRET_BYTES <= len(random_bytes) <= MAX_SECRET_BYTES:
        raise SecretError(f"need {MIN_SECRET_BYTES}-{MAX_SECRET_BYTES} random bytes")
    return PREFIX + base64.b64encode(random_bytes).decode("ascii")


def sign(key: bytes, msg_id: str, body: bytes, now: float) -> dict[str, str]:
    """The three Standard Webhooks headers for one attempt sent at `now`."""
    timestamp = datetime.fromtimestamp(int(now), tz=UTC)
    signature = Webhook(key).sign(msg_id, timestamp, body.decode("utf-8"))
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now)),
        "webhook-signature": signature,
    }


def verify(
    key: bytes,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
) -> str | None:
    """Why the request is not validly signed with `key` at `now`, or None when it is.

    `headers` must be case-insensitive or lower-cased (Starlette's and httpx's are).
    """
    msg_id = headers.get("webhook-id", "")
    stamp = headers.get("webhook-timestamp", "")
    signatures = headers.get("webhook-signature", "")
    if not (msg_id and stamp and signatures):
        return "unsigned: webhook-id, webhook-timestamp and webhook-signature are required"
    if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        return "webhook-timestamp must be whole Unix seconds"
    if abs(now - int(stamp)) > tolerance:
        return f"webhook-timestamp is outside the {int(tolerance)} s tolerance (replayed, or a clock is off)"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "the body is not UTF-8"
    expected = Webhook(key).sign(msg_id, datetime.fromtimestamp(int(stamp), tz=UTC), text)
    wanted = expected.encode("ascii")
    for candidate in signatures.split(" ")[:_MAX_SIGNATURES]:
        if hmac.compare_digest(candidate.encode("utf-8", "replace"), wanted):
            return None
    return "no matching v1 signature"
