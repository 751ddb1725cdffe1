"""When the readiness probe may send its ntfy credentials again after ntfy refused them.

ntfy counts failed logins per address: 30, then one back a minute (ntfy-spec section 5, 429
42909), and it answers 42909 before it even reads a valid token. Two boxes behind one NAT share
that budget, so a standby whose token is refused must not spend it: the leader's next reconnect
would be refused too, and it would stay deaf. After a refusal (401, 403, or 429 42909) the probe
waits FIRST_WAIT, then twice as long each time, up to LONGEST_WAIT; a probe ntfy accepts resets it.

The figures against the budget: refusals at 0, 1, 3, 7, 15, 31 min, then every 30 min: 6 in the
first hour and 2 an hour after, where the refill alone gives back 60 an hour. The probe never
takes more than 6 of the 30 it shares with the leader, and spends far less than comes back.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_WAIT = 60.0  # one refill of ntfy's auth-failure budget
LONGEST_WAIT = 30 * 60.0  # an operator who fixed the token hears "ready" within half an hour


@dataclass(frozen=True, slots=True)
class Backoff:
    """The refusals in a row, and when (the injected clock's seconds) the next try may go."""

    refusals: int = 0
    next_at: float | None = None

    def due(self, now: float) -> bool:
        return self.next_at is None or now >= self.next_at

    def wait(self, now: float) -> float:
        """Seconds until the next try may go (0 when due)."""
        return 0.0 if self.next_at is None else max(0.0, self.next_at - now)


def refused(state: Backoff, now: float) -> Backoff:
    """ntfy refused the credentials at `now`: the next try waits twice as long as the last."""
    wait = min(LONGEST_WAIT, FIRST_WAIT * 2.0 ** min(state.refusals, 32))
    return Backoff(state.refusals + 1, now + wait)


def accepted() -> Backoff:
    """ntfy accepted them (or answered without judging them): no wait."""
    return Backoff()


def is_refusal(status: int, code: str | None) -> bool:
    """A refusal of the credentials: 401, 403, or 429 42909 (too many failed logins here)."""
    return status in (401, 403) or (status == 429 and (code or "").startswith("42909"))
