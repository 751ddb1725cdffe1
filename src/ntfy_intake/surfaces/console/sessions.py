"""Console sessions and their CSRF tokens: in memory, bounded, expiring.

A right `http.token` at login (checked by the surface's `LoginGuard`, which counts the wrong
ones) opens a session: a random id in an HttpOnly, SameSite=Strict
cookie (Secure behind TLS) and a random CSRF token that every form carries back. Sessions live
in the daemon's memory only: a restart logs the owner out, which costs one login and leaves no
session file to steal. The clock is injected (tests move it; nothing sleeps).
"""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "ntfy_intake_console"
TTL = 12 * 3600.0
MAX_SESSIONS = 64  # the oldest is dropped past this: a login loop cannot grow memory


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    csrf: str
    expires_at: float


class Sessions:
    def __init__(self, clock: Callable[[], float], ttl: float = TTL) -> None:
        self._clock = clock
        self._ttl = ttl
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    @property
    def ttl(self) -> float:
        return self._ttl

    def open(self) -> Session:
        session = Session(
            secrets.token_urlsafe(32), secrets.token_urlsafe(32), self._clock() + self._ttl
        )
        self._by_id[session.sid] = session
        while len(self._by_id) > MAX_SESSIONS:
            self._by_id.popitem(last=False)
        return session

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        session = self._by_id.get(sid)
        if session is None:
            return None
        if self._clock() >= session.expires_at:
            del self._by_id[sid]
            return None
        return session

    def close(self, sid: str | None) -> None:
        if sid:
            self._by_id.pop(sid, None)

    @staticmethod
    def csrf_ok(session: Session, presented: object) -> bool:
        return isinstance(presented, str) and hmac.compare_digest(
            presented.encode("utf-8", "replace"), session.csrf.encode()
        )
