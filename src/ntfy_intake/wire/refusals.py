"""What a refused subscribe means: keep the cursor or not, how long to wait, what the owner hears.

Pure (no I/O, no clock). Rules (DESIGN.md section 3, ntfy-spec.md sections 1.2 and 5):
- only a 400 whose body has code 40008 ("invalid since parameter") concerns the cursor; every
  other refusal (40009 topic not allowed or too many topics, 401, 403, 429, 5xx) keeps it;
- ntfy locks the whole IP out after 30 failed authentications, refilling one a minute: after 3
  consecutive 401s the wait is at least 5 minutes. A 403 is an ACL denial and spends nothing;
  after a 42909 (locked out) the wait is at least a minute. ntfy sends no Retry-After; one that
  is present is honoured by the caller's backoff;
- the owner hears once per kind (credentials, acl, rate_limit, rejected) per episode, an episode
  ending when a subscription opens. Server trouble (5xx) is left to the liveness notices.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

import httpx

from ntfy_intake.rules import backoff

CURSOR_INVALID = 40008
AUTH_LOCKOUT_AFTER = 3  # consecutive 401s before the long wait
AUTH_BACKOFF = 300.0
AUTH_LOCKED_BACKOFF = 60.0  # 42909: one failed authentication comes back per minute
AUTH_LOCKED_OUT = 42909


class StatusFailure(Exception):
    """ntfy answered a subscribe or a poll with something other than 200."""

    def __init__(
        self,
        status: int,
        retry_after: float | None,
        code: int | None = None,
        error: str = "",
        body: str = "",
    ) -> None:
        super().__init__(f"HTTP {status}" + (f" {code}: {error}" if code else ""))
        self.status = status
        self.retry_after = retry_after
        self.code = code
        self.error = error
        self.body = body  # as ntfy sent it (already cut to a bounded length), for diagnosis


@dataclass(frozen=True, slots=True)
class Refused:
    """ntfy refused the subscription for a reason the owner can act on (once per episode)."""

    category: str  # credentials | acl | rate_limit | rejected
    status: int
    code: int | None
    error: str
    topics: str
    episode: str

    def naming(self, topics: str) -> Refused:
        return replace(self, topics=topics)


def category(status: int) -> str | None:
    """The kind of refusal the owner is told about; None for server trouble."""
    if status == 401:
        return "credentials"
    if status == 403:
        return "acl"
    if status == 429:
        return "rate_limit"
    if 400 <= status < 500:
        return "rejected"
    return None


def parse_error_body(body: str) -> tuple[int | None, str]:
    """ntfy's error JSON as (code, error text); (None, the text) when it is not that."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None, body.strip()[:200]
    if not isinstance(parsed, dict):
        return None, body.strip()[:200]
    code = parsed.get("code")
    error = parsed.get("error")
    return (
        code if isinstance(code, int) and not isinstance(code, bool) else None,
        error[:200] if isinstance(error, str) else body.strip()[:200],
    )


def status_failure(status: int, headers: httpx.Headers, body: str) -> StatusFailure:
    code, error = parse_error_body(body)
    retry_after = backoff.parse_retry_after(headers.get("Retry-After"), time.time())
    return StatusFailure(status, retry_after, code, error, body)


def describe_error_body(body: str) -> str:
    """ntfy's error JSON, reduced to `code: error` for logs and notices."""
    code, error = parse_error_body(body)
    return error if code is None else f"{code}: {error}"


@dataclass(slots=True)
class Episodes:
    """Consecutive 401s and the kinds already reported in the current episode."""

    episode: int = 0
    auth_failures: int = 0
    noticed: set[str] = field(default_factory=set)

    def refused(self, failure: StatusFailure) -> tuple[float | None, Refused | None]:
        """The least wait this refusal imposes, and a report if the owner has not heard yet."""
        wait = failure.retry_after
        if failure.status == 401:
            self.auth_failures += 1
            if self.auth_failures >= AUTH_LOCKOUT_AFTER:
                wait = max(wait or 0.0, AUTH_BACKOFF)
        elif failure.status != 403:  # an ACL denial spends no authentication budget
            self.auth_failures = 0
        if failure.code == AUTH_LOCKED_OUT:
            wait = max(wait or 0.0, AUTH_LOCKED_BACKOFF)
        kind = category(failure.status)
        if kind is None or kind in self.noticed:
            return wait, None
        self.noticed.add(kind)
        error = failure.error or f"HTTP {failure.status}"
        return wait, Refused(kind, failure.status, failure.code, error, "", str(self.episode))

    def connected(self) -> None:
        """A subscription opened: the episode is over."""
        self.auth_failures = 0
        if self.noticed:
            self.episode += 1
            self.noticed.clear()
