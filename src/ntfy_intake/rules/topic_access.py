"""Which topics the stream carries, and when a topic ntfy refused is tried again.

Pure (plain values, an injected clock and rng). DESIGN.md section 12, "One forbidden topic never
blinds the others": ntfy refuses a whole multi-topic subscribe when any one topic is not readable
(403 40301 with `auth-file`; 400 40009 for a topic it will not serve), so one revoked ACL would
blind intake for every topic. Intake then probes each topic on its own (`poll=1&since=none`, which
returns nothing but passes the same checks), streams the readable ones, and retries each refused
one on its own backoff schedule while the rest stream. An episode of a topic runs from its refusal
to its readmission; the owner hears once per episode.

- `per_topic(status, code)`: a refusal that can be about one topic: 403 or 400 40009. Not a 401:
  ntfy authenticates before it looks at topics (ntfy-spec.md section 5; an anonymous reader of a
  protected topic gets 403), so a 401 is the same for every topic, and probing would spend ntfy's
  authentication budget (it locks an IP out after 30) for nothing. A probe that meets a 401 (the
  token changed meanwhile) ends the probing (`Probe.STOP`).
- Probing a refused subscribe that splits nothing (every topic refused) is not repeated on every
  reconnect: the next probe round waits its own backoff (`probed_nothing`) until a stream opens.
- A topic is dropped only when its own probe was refused; a probe that failed otherwise (5xx, 429,
  a timeout) says nothing and the topic stays. When no topic or every topic is refused, nothing is
  split: the whole subscribe is refused, as before (backoff, one `subscribe_refused` notice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from ntfy_intake.rules import backoff

TOPIC_REFUSED = 40009  # ntfy: a disallowed topic, or too many topics (ntfy-spec.md 1.2)
# A refused topic is tried again after RETRY_FACTOR reconnect-backoff bases (15-30 s by default),
# doubling up to RETRY_CAP: an ACL is fixed by hand, minutes are soon enough, and each retry is
# one request from ntfy's bucket (one per 5 s).
RETRY_FACTOR = 30.0
RETRY_CAP = 900.0


class Probe(Enum):
    """What one topic's probe said."""

    ALLOWED = "allowed"
    REFUSED = "refused"  # this topic is not readable: drop it from the stream
    STOP = "stop"  # a credential refusal: the same for every topic, probing more spends budget
    UNKNOWN = "unknown"  # server trouble, a timeout: keep the topic


def per_topic(status: int, code: int | None) -> bool:
    """A refused subscribe worth probing topic by topic."""
    return status == 403 or (status == 400 and code == TOPIC_REFUSED)


def classify(status: int | None, code: int | None) -> Probe:
    """One probe's answer (None: no answer at all)."""
    if status == 200:
        return Probe.ALLOWED
    if status == 401:
        return Probe.STOP
    if status is not None and per_topic(status, code):
        return Probe.REFUSED
    return Probe.UNKNOWN


@dataclass(slots=True)
class Refusal:
    """One topic out of the stream: why, since when, and when it is tried next."""

    status: int
    code: int | None
    error: str
    since: int  # server time (Unix s) from which its backlog is owed once it is back
    episode: str
    attempts: int = 0
    due: float = 0.0  # monotonic


@dataclass(slots=True)
class TopicAccess:
    """The configured topics, those refused on their own, and their retry schedule."""

    topics: tuple[str, ...]
    rng: Callable[[], float]
    base: float = RETRY_FACTOR
    cap: float = RETRY_CAP
    refused: dict[str, Refusal] = field(default_factory=dict)
    _rounds: int = 0  # probe rounds in a row that split nothing
    _round_due: float = float("-inf")  # monotonic

    def probe_due(self, now: float) -> bool:
        """A refused subscribe may be probed topic by topic now."""
        return now >= self._round_due

    def probed_nothing(self, now: float) -> None:
        """A probe round split nothing: the next one waits longer."""
        self._round_due = now + self._delay(self._rounds)
        self._rounds += 1

    def connected(self) -> None:
        """A stream opened: the next refusal is probed at once."""
        self._rounds, self._round_due = 0, float("-inf")

    def streamed(self) -> tuple[str, ...]:
        """The topics the stream carries, in configured order."""
        return tuple(t for t in self.topics if t not in self.refused)

    def split(self, probes: Iterable[tuple[str, Probe]]) -> list[str]:
        """The topics to drop, from the probes of the streamed ones; [] when nothing is to be
        split (none refused, a credential refusal, or every streamed topic refused)."""
        dropped: list[str] = []
        for topic, probe in probes:
            if probe is Probe.STOP:
                return []
            if probe is Probe.REFUSED:
                dropped.append(topic)
        if len(dropped) >= len(self.streamed()):
            return []
        return dropped

    def refuse(
        self,
        topic: str,
        status: int,
        code: int | None,
        error: str,
        *,
        since: int,
        episode: str,
        now: float,
    ) -> Refusal:
        """Take `topic` out of the stream; its first retry is due after one backoff step."""
        refusal = Refusal(status, code, error, since, episode)
        refusal.due = now + self._delay(0)
        refusal.attempts = 1
        self.refused[topic] = refusal
        return refusal

    def still_refused(self, topic: str, now: float) -> None:
        """A retry was refused again (or failed): the next one waits longer."""
        refusal = self.refused[topic]
        refusal.due = now + self._delay(refusal.attempts)
        refusal.attempts += 1

    def readmit(self, topic: str) -> Refusal:
        """A retry was allowed: the episode is over, the topic streams again."""
        return self.refused.pop(topic)

    def due(self, now: float) -> list[str]:
        return [t for t, r in self.refused.items() if r.due <= now]

    def next_due(self) -> float | None:
        return min((r.due for r in self.refused.values()), default=None)

    def _delay(self, attempt: int) -> float:
        return backoff.delay(attempt, base=self.base, cap=self.cap, rng=self.rng)
