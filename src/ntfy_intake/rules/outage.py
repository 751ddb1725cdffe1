"""A database outage as one node sees it (DESIGN.md section 11, "Also owed by section 9"): the
owner hears of one that lasted longer than the lease, once per episode, naming its length.

Pure: the caller feeds what the store did (answered or not) with a monotonic time and the term
this node last saw in the lease row, and gets back an episode once it ended, if it lasted longer
than `lease_ttl`. An outage that long ended the term (no renewal could succeed), so every node
that saw it owes the same notice; its key is the term seen before it began, the same on every
node that read the row, so the second node to record it is a no-op (the owner outbox's key).
A shorter outage (a restart, a dropped session) costs nothing and tells nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Outage:
    """One ended episode: how long the store did not answer, and the term seen before it."""

    seconds: float
    term: int | None


class OutageClock:
    """The episode going on, if any (module doc)."""

    def __init__(self, lease_ttl: float) -> None:
        self.lease_ttl = lease_ttl
        self.began: float | None = None  # the first unanswered statement of the episode
        self.term: int | None = None  # the term seen before it

    def observe(self, answered: bool, now: float, term: int | None) -> Outage | None:
        """The store answered (or did not) at `now`; `term`: the one seen last before now. The
        episode that ends with this answer, when it lasted longer than the lease."""
        if not answered:
            if self.began is None:
                self.began, self.term = now, term
            return None
        if self.began is None:
            return None
        ended = Outage(now - self.began, self.term)
        self.began = self.term = None
        return ended if ended.seconds > self.lease_ttl else None
