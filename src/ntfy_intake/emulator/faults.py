"""Fault injection: the failures and races of a real ntfy server, on demand.

Every method is thread-safe (the hub's lock) and takes effect for the next request or message.
Invariants owned here:
- an injected subscribe failure answers before anything else the server checks, with an
  ntfy-style error body; `fail_subscribes` counts every subscribe request (streams and polls),
  `force_400` only those whose `since` is a cursor (the probe `since=all` passes untouched);
- `swap_next_live` holds the first of the next two published messages back from live delivery
  only; both are cached at once, in publish order;
- `silence` turns streams into zombies: they write nothing (not even headers) until they close;
- `lag_cache_writes` models ntfy publishing live before its (batched) cache write: live delivery
  is untouched, the cache row (and its row id) appears only when the lag ends or on release;
- `replay_after_live` models ntfy writing `open` after registering the subscriber and querying the
  cache only then: the next stream gets open, then the next live message, then its replay (taken
  after that message, so the message comes twice, as it can on ntfy);
- `shuffle_same_second` models Go's unstable sort of multi-topic replays: rows of one second come
  in a random order on streams with several topics.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

from ntfy_intake.emulator import wire
from ntfy_intake.emulator.stream import Stream
from ntfy_intake.emulator.wire import Event, NtfyError

if TYPE_CHECKING:
    import threading

    from ntfy_intake.emulator.cache import MessageCache, Row

_KNOWN_ERRORS = {
    400: wire.BAD_REQUEST,
    401: wire.UNAUTHORIZED,
    403: wire.FORBIDDEN,
    404: wire.NOT_FOUND,
    429: wire.TOO_MANY_REQUESTS,
    500: wire.INTERNAL_ERROR,
}


@dataclass(frozen=True)
class InjectedFailure:
    """What an injected subscribe failure answers with."""

    error: NtfyError
    retry_after: int | None
    name: str


@dataclass(frozen=True)
class Delivery:
    """A live delivery the hub should schedule `delay` seconds from now."""

    delay: float
    event: Event
    targets: tuple[Stream, ...]


def injected_error(status: int) -> NtfyError:
    """ntfy's own error for statuses it uses, else `<status>01` with the reason phrase."""
    if status in _KNOWN_ERRORS:
        return _KNOWN_ERRORS[status]
    return NtfyError(status * 100 + 1, status, HTTPStatus(status).phrase.lower())


class FaultTarget(Protocol):
    """What the switches act on: the hub's lock, cache, clock and open streams. A protocol, so
    this module does not import the hub that owns a `Faults`."""

    lock: threading.RLock
    cache: MessageCache

    def now(self) -> float: ...
    def schedule(self, deliveries: Iterable[Delivery]) -> None: ...
    def drop_streams(self, *, graceful: bool = False) -> int: ...
    def inject_raw(self, data: bytes) -> int: ...
    def zombify_streams(self) -> None: ...
    def evict(self, ids: Iterable[str] | None) -> list[str]: ...


class Faults:
    """The fault switches of one emulator (see docs/emulator.md for each one)."""

    def __init__(self, hub: FaultTarget) -> None:
        self._hub = hub
        self._silenced = False
        self._forced_400 = 0
        self._failures = 0
        self._failure_status = 503
        self._failure_retry_after: int | None = None
        self._swap_delay: float | None = None
        self._held: tuple[Event, tuple[Stream, ...]] | None = None
        self._duplicate = False
        self._cache_lag: float | None = None  # seconds; math.inf holds writes until released
        self._pending_writes: list[tuple[float, Event]] = []
        self._replay_after_live: float | None = None
        self._shuffle: random.Random | None = None

    # -- the switches ---------------------------------------------------------------------------
    def silence(self, on: bool = True) -> None:
        """New and open streams send nothing at all (no headers, open, keepalive or message)."""
        with self._hub.lock:
            self._silenced = on
            if on:
                self._hub.zombify_streams()

    def drop_connections(self, *, graceful: bool = False) -> int:
        """Abort every open subscriber connection now (or end it cleanly); returns how many."""
        return self._hub.drop_streams(graceful=graceful)

    def inject_raw(self, data: bytes) -> int:
        """Write these bytes verbatim into every open stream: junk lines, partial lines, frames
        of wrong types, as a broken server or proxy could send. Not cached; returns how many
        streams got them."""
        return self._hub.inject_raw(data)

    def force_400(self, n: int = 1) -> None:
        """The next n subscribe requests that carry a cursor (a `since` that is not empty, `all`,
        `none` or `latest`) get 400 with the exact `invalid since parameter` body: the only
        requests a real server could answer so."""
        with self._hub.lock:
            self._forced_400 = n

    def evict(self, ids: Iterable[str] | None = None) -> list[str]:
        """Remove these ids (all when None) from the cache, as pruning would; returns them."""
        return self._hub.evict(ids)

    def fail_subscribes(self, n: int, status: int = 503, retry_after: float | None = None) -> None:
        """The next n subscribe requests fail with `status` (Retry-After sent when given)."""
        error = injected_error(status)  # validates the status before anything changes
        with self._hub.lock:
            self._failures = n
            self._failure_status = error.http
            self._failure_retry_after = None if retry_after is None else math.ceil(retry_after)

    def swap_next_live(self, delay: float = 0.2) -> None:
        """The next two live messages arrive swapped: the 2nd at once, the 1st `delay` s later."""
        with self._hub.lock:
            self._swap_delay = delay

    def duplicate_at_subscribe(self) -> None:
        """The next stream whose replay is not empty gets its newest message twice: once right
        after `open` (as if delivered live) and again in the replay."""
        with self._hub.lock:
            self._duplicate = True

    def lag_cache_writes(self, seconds: float | None = math.inf) -> None:
        """Messages published from now on reach live subscribers at once but are written to the
        cache (and get their row id) only `seconds` later by the emulator's clock, or, with the
        default, when `release_cache_writes()` is called. None turns the lag off (pending writes
        stay pending until released or due)."""
        with self._hub.lock:
            self._cache_lag = seconds

    def release_cache_writes(self) -> int:
        """Write every pending (lagging) message to the cache now; returns how many."""
        with self._hub.lock:
            pending, self._pending_writes = self._pending_writes, []
            for _, event in pending:
                self._hub.cache.add(event)
            return len(pending)

    def replay_after_live(self, timeout: float = 1.0) -> None:
        """The next stream writes `open`, then waits (up to `timeout` real seconds) for one live
        message, and only then takes and sends its replay."""
        with self._hub.lock:
            self._replay_after_live = timeout

    def shuffle_same_second(self, on: bool = True, seed: int | None = None) -> None:
        """Replays on multi-topic streams come in a random order within each second."""
        with self._hub.lock:
            self._shuffle = random.Random(seed) if on else None

    def misbehave_inclusive_since_id(self, on: bool = True) -> None:
        """A deliberate bug, not a real-server behaviour: `since=<id>` also returns the cursor's
        own message. For proving that conformance and differential tests can fail."""
        with self._hub.lock:
            self._hub.cache.inclusive_id_cursor = on

    def clear(self) -> None:
        """Every switch off; a held-back message is delivered now, lagging writes are made."""
        self.silence(False)
        self.release_cache_writes()
        with self._hub.lock:
            self._forced_400 = self._failures = 0
            self._failure_retry_after = None
            self._swap_delay = None
            self._duplicate = False
            self._cache_lag = None
            self._replay_after_live = None
            self._shuffle = None
            self._hub.cache.inclusive_id_cursor = False
            held, self._held = self._held, None
        if held is not None:
            self._hub.schedule([Delivery(0.0, *held)])

    def snapshot(self) -> dict[str, Any]:
        with self._hub.lock:
            return {
                "silenced": self._silenced,
                "force_400": self._forced_400,
                "fail_subscribes": {
                    "n": self._failures,
                    "status": self._failure_status,
                    "retry_after": self._failure_retry_after,
                },
                "swap_next_live": self._swap_delay,
                "holding": None if self._held is None else self._held[0].id,
                "duplicate_at_subscribe": self._duplicate,
                "lag_cache_writes": (
                    "until_released" if self._cache_lag == math.inf else self._cache_lag
                ),
                "pending_cache_writes": len(self._pending_writes),
                "replay_after_live": self._replay_after_live,
                "shuffle_same_second": self._shuffle is not None,
                "misbehave_inclusive_since_id": self._hub.cache.inclusive_id_cursor,
            }

    def apply(self, spec: Mapping[str, Any]) -> None:
        """The admin endpoint's JSON form, e.g. {"fail_subscribes": {"n": 3, "status": 503}}."""
        actions: dict[str, Callable[[Any], object]] = {
            "clear": lambda v: self.clear() if v else None,
            "silence": lambda v: self.silence(bool(v)),
            "drop_connections": lambda v: (
                self.drop_connections(graceful=v == "graceful") if v else None
            ),
            "force_400": lambda v: self.force_400(int(v)),
            "evict": lambda v: self.evict(None if v == "all" else [str(i) for i in v]),
            "fail_subscribes": lambda v: self.fail_subscribes(**v),
            "swap_next_live": lambda v: self.swap_next_live(0.2 if v is True else float(v)),
            "duplicate_at_subscribe": lambda v: self.duplicate_at_subscribe() if v else None,
            "inject_raw": lambda v: self.inject_raw(str(v).encode("utf-8", "surrogateescape")),
            "lag_cache_writes": lambda v: self.lag_cache_writes(
                math.inf if v is True else None if v is False else float(v)
            ),
            "release_cache_writes": lambda v: self.release_cache_writes() if v else None,
            "replay_after_live": lambda v: self.replay_after_live(1.0 if v is True else float(v)),
            "shuffle_same_second": lambda v: self.shuffle_same_second(bool(v)),
            "misbehave_inclusive_since_id": lambda v: self.misbehave_inclusive_since_id(bool(v)),
        }
        unknown = set(spec) - set(actions)
        if unknown:
            raise ValueError(f"unknown faults: {sorted(unknown)}")
        for key, value in spec.items():
            actions[key](value)

    # -- used by the hub and the HTTP layer (the lock is re-entrant) -----------------------------
    def take_subscribe_failure(self, *, carries_cursor: bool) -> InjectedFailure | None:
        with self._hub.lock:
            if self._failures > 0:
                self._failures -= 1
                error = injected_error(self._failure_status)
                return InjectedFailure(error, self._failure_retry_after, "fail_subscribes")
            if self._forced_400 > 0 and carries_cursor:
                self._forced_400 -= 1
                return InjectedFailure(wire.SINCE_INVALID, None, "force_400")
            return None

    def take_duplicate(self) -> bool:
        with self._hub.lock:
            taken, self._duplicate = self._duplicate, False
            return taken

    def take_replay_after_live(self) -> float | None:
        with self._hub.lock:
            taken, self._replay_after_live = self._replay_after_live, None
            return taken

    def cache_add(self, event: Event) -> None:
        """The cache write of a published message, lagging when the switch is on."""
        with self._hub.lock:
            if self._cache_lag is None:
                self._hub.cache.add(event)
            else:
                self._pending_writes.append((self._hub.now() + self._cache_lag, event))

    def flush_due_cache_writes(self) -> None:
        """Make the lagging writes whose time has come (called before every cache read)."""
        with self._hub.lock:
            now = self._hub.now()
            while self._pending_writes and self._pending_writes[0][0] <= now:
                self._hub.cache.add(self._pending_writes.pop(0)[1])

    def visible_replay(self, rows: list[Row], *, topics: int) -> list[Row]:
        """A replay as the client sees it: shuffled within each second on multi-topic streams
        when the switch is on."""
        with self._hub.lock:
            if self._shuffle is None or topics < 2:
                return rows
            by_second: dict[int, list[Row]] = {}
            for row in rows:
                by_second.setdefault(row.event.time, []).append(row)
            out: list[Row] = []
            for second in sorted(by_second):
                group = by_second[second]
                self._shuffle.shuffle(group)
                out.extend(group)
            return out

    def is_silenced(self) -> bool:
        with self._hub.lock:
            return self._silenced

    def route_live(self, event: Event, targets: tuple[Stream, ...]) -> list[Delivery]:
        """Live deliveries for one published event, with the swap fault applied."""
        with self._hub.lock:
            if self._swap_delay is None:
                return [Delivery(0.0, event, targets)]
            if self._held is None:
                self._held = (event, targets)
                return []
            first, first_targets = self._held
            delay = self._swap_delay
            self._held = None
            self._swap_delay = None
            return [Delivery(0.0, event, targets), Delivery(delay, first, first_targets)]
