"""Failed logins throttled: per client address and overall (DESIGN.md section 10, turn 4).

Pure: every call takes `now` (a monotonic reading), nothing sleeps or reads a clock.

The rule, per bucket (one per client address, one for every address together):
- `Policy.failures` wrong tokens within `Policy.window` put the bucket on hold for
  `Policy.first_hold`: every attempt meanwhile is refused unchecked (429, Retry-After), even one
  carrying the right token, so a guess costs the guesser the hold and not a token check.
- Once a hold ends, the bucket is on probation: its next failure starts a hold twice as long as
  the last (60 s, 2, 4, 8 min, then 15 min for ever while failures go on). A guesser gets
  `failures` guesses, then one per hold: under 10 in the first half hour, 4 an hour after it.
- A success forgives nothing: failures leave the count only by age (`Policy.window`). An address
  is one client to the throttle, and may be many people (every loopback process, everyone
  behind one NAT): an agent polling with the right token must not reset the count of a guesser
  on its address, which would then get `failures - 1` checked guesses per poll, never held.
- An episode is a run of holds; it ends once the bucket has had no failure for `Policy.max_hold`
  after its last hold ended. The first hold of an episode is reported (`Outcome.began`): the
  owner is told once per episode, naming the address.

The overall bucket counts every address's failures, with a higher limit (`overall_failures`),
so guesses spread over many addresses (an IPv6 prefix, a botnet) are bounded too. So that a
stranger cannot lock the owner out of the console for ever by keeping it held, the overall hold
never applies to a loopback client (the box itself, an SSH tunnel) nor to an address that
logged in successfully within `Policy.trust` (a day): those are held only by their own bucket.

Addresses: IPv6 addresses are counted by their /64 (one host usually owns a whole /64, and
rotating inside it must not reset the count); an IPv4-mapped IPv6 address is its IPv4 address;
every loopback address (all of 127.0.0.0/8 and ::1) is one client, `LOOPBACK`: a local user can
connect from any of them, and must not get 5 guesses per address.
At most `Policy.remember` addresses are tracked; the least recently seen is forgotten first.
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict
from dataclasses import dataclass, field

OVERALL = "*"  # the overall bucket's name in an Outcome
LOOPBACK = "loopback"  # every loopback address's one bucket


@dataclass(frozen=True, slots=True)
class Policy:
    failures: int = 5  # wrong tokens from one address within `window` before its first hold
    window: float = 60.0
    first_hold: float = 60.0
    max_hold: float = 900.0  # holds double up to this (15 min)
    overall_failures: int = 30  # wrong tokens from every address together within `window`
    trust: float = 86400.0  # a successful login keeps its address clear of the overall hold
    remember: int = 4096  # addresses tracked at once


@dataclass(slots=True)
class _Bucket:
    failures: list[float] = field(default_factory=list)  # within the window, oldest first
    held_until: float = 0.0
    hold: float = 0.0  # the last hold's length in this episode; 0: no hold yet
    counted: int = 0  # failures in this episode (for the notice)

    def held(self, now: float) -> float:
        return max(0.0, self.held_until - now)

    def over(self, now: float, policy: Policy) -> bool:
        """Nothing left to remember: no failure within the window, no episode running."""
        if self.hold > 0:
            return now >= self.held_until + policy.max_hold
        return not self.failures or now - self.failures[-1] >= policy.window

    def fail(self, now: float, limit: int, policy: Policy) -> bool:
        """Count a failure; True when it starts the episode's first hold."""
        self.counted += 1
        if self.held(now) > 0:
            return False  # already held (only the overall bucket sees this: exempt clients)
        if self.hold > 0:  # on probation: one failure is enough, the hold doubles
            self.hold = min(self.hold * 2, policy.max_hold)
            self.held_until = now + self.hold
            return False
        self.failures = [t for t in self.failures if now - t < policy.window]
        self.failures.append(now)
        if len(self.failures) < limit:
            return False
        self.failures.clear()
        self.hold = min(policy.first_hold, policy.max_hold)
        self.held_until = now + self.hold
        return True


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one failure did: the hold now on the address (seconds, 0 for none), and which
    buckets began an episode with it (the client key, `OVERALL`), each with its failures."""

    hold: float
    began: tuple[tuple[str, int], ...] = ()


def client_key(address: str) -> str:
    """The bucket an address counts in: itself, or its /64 for IPv6 (see the module docstring)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address[:100]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return LOOPBACK
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def retry_after(seconds: float) -> int:
    """A hold as a Retry-After value: whole seconds, never 0 while held."""
    return max(1, math.ceil(seconds))


class Throttle:
    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._overall = _Bucket()
        self._trusted: OrderedDict[str, float] = OrderedDict()  # client key -> trusted until

    def held(self, address: str, now: float) -> float:
        """Seconds the address must wait before it may try a token; 0 when it may now."""
        key = client_key(address)
        bucket = self._touch(key, now, create=False)
        own = bucket.held(now) if bucket is not None else 0.0
        if self._exempt(address, key, now):
            return own
        return max(own, self._overall.held(now))

    def failed(self, address: str, now: float) -> Outcome:
        """A wrong token from `address` (checked because `held` said 0)."""
        key = client_key(address)
        bucket = self._touch(key, now, create=True)
        assert bucket is not None
        began: list[tuple[str, int]] = []
        if bucket.fail(now, self.policy.failures, self.policy):
            began.append((key, bucket.counted))
        if self._overall.over(now, self.policy):
            self._overall = _Bucket()
        if self._overall.fail(now, self.policy.overall_failures, self.policy):
            began.append((OVERALL, self._overall.counted))
        return Outcome(self.held(address, now), tuple(began))

    def succeeded(self, address: str, now: float) -> None:
        """The right token from `address`: the overall hold no longer applies to it for
        `Policy.trust`. Its own count stays (module doc: a success forgives nothing)."""
        key = client_key(address)
        self._trusted[key] = now + self.policy.trust
        self._trusted.move_to_end(key)
        while len(self._trusted) > self.policy.remember:
            self._trusted.popitem(last=False)

    def tracked(self) -> int:
        """Addresses remembered now (bounded by `Policy.remember`)."""
        return len(self._buckets)

    def _exempt(self, address: str, key: str, now: float) -> bool:
        if is_loopback(address):
            return True
        until = self._trusted.get(key)
        if until is None:
            return False
        if now >= until:
            del self._trusted[key]
            return False
        return True

    def _touch(self, key: str, now: float, *, create: bool) -> _Bucket | None:
        bucket = self._buckets.get(key)
        if bucket is not None and bucket.over(now, self.policy):
            del self._buckets[key]
            bucket = None
        if bucket is None:
            if not create:
                return None
            bucket = self._buckets[key] = _Bucket()
            while len(self._buckets) > self.policy.remember:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(key)
        return bucket
