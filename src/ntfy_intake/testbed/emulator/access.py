"""Who may do what: authentication, topic ACLs and the per-visitor limiters.

Invariants owned here (ntfy-spec.md section 5):
- the credential comes from the `Authorization` header, or from `?auth=`/`?authorization=` holding
  the whole header value as unpadded base64url (which wins; a bad encoding is a 500, code 50001);
- only values starting with `Basic ` or `Bearer ` (any case) are tried, anything else is anonymous;
  `Bearer` must be spelled exactly so to be read as a token, and a Basic value with an empty user
  name carries the token as its password; an unknown or malformed token is a 401 (code 40101);
- a token bucket refills continuously from the injected clock (golang.org/x/time/rate semantics),
  and a fixed limiter counts what is open right now.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Collection, Mapping

from ntfy_intake.testbed.emulator.params import Params, go_trim
from ntfy_intake.testbed.emulator.wire import INTERNAL_ERROR, UNAUTHORIZED

_RAW_URL_B64 = re.compile(r"[A-Za-z0-9_-]*", re.ASCII)
_TOKEN_LENGTH = 32


def read_auth_header(params: Params) -> str:
    """readAuthHeader: the header value, overridden by the decoded `auth` query parameter."""
    value = go_trim(params.header("authorization"))
    encoded = params.query_param("authorization", "auth")
    if encoded != "":
        value = go_trim(_raw_url_b64decode(encoded).decode("utf-8", "replace"))
    return value


def _raw_url_b64decode(text: str) -> bytes:
    compact = text.replace("\r", "").replace("\n", "")
    if _RAW_URL_B64.fullmatch(compact) is None or len(compact) % 4 == 1:
        raise INTERNAL_ERROR
    try:
        return base64.urlsafe_b64decode(compact + "=" * (-len(compact) % 4))
    except (binascii.Error, ValueError):
        raise INTERNAL_ERROR from None


def supported_auth_header(value: str) -> bool:
    lowered = value.lower()
    return lowered.startswith(("basic ", "bearer "))


def authenticate(value: str, tokens: Mapping[str, Collection[str]]) -> tuple[str, ...]:
    """The readable topic patterns of a supported credential; raises 401 when it is not valid."""
    if value.startswith("Bearer"):
        token = go_trim(value.removeprefix("Bearer"))
    else:
        token = _token_from_basic(value)
    if len(token) != _TOKEN_LENGTH or token not in tokens:
        raise UNAUTHORIZED
    return tuple(tokens[token])


def _token_from_basic(value: str) -> str:
    if value[:6].lower() != "basic ":
        raise UNAUTHORIZED
    try:
        decoded = base64.b64decode(value[6:], validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        raise UNAUTHORIZED from None
    username, colon, password = decoded.partition(":")
    if not colon or username != "":
        raise UNAUTHORIZED  # user/password logins: the emulator has tokens only
    return password


def can_read(patterns: Collection[str], topic: str) -> bool:
    """ACL match: `*` stands for any run of characters."""
    return any(
        re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), topic)
        for pattern in patterns
    )


class TokenBucket:
    """rate.Limiter: `burst` tokens, one more every `every` seconds, starting full."""

    def __init__(self, burst: int, every: float, now: float) -> None:
        self._burst = float(burst)
        self._every = every
        self._tokens = float(burst)
        self._last = now

    def tokens(self, now: float) -> float:
        if now > self._last:
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._every)
        self._last = now
        return self._tokens

    def allow(self, now: float) -> bool:
        if self.tokens(now) >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class FixedLimiter:
    """util.FixedLimiter: at most `limit` held at once."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.value = 0

    def allow(self) -> bool:
        if self.value + 1 > self._limit:
            return False
        self.value += 1
        return True

    def release(self) -> None:
        self.value = max(0, self.value - 1)
