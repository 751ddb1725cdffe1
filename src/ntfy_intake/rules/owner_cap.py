"""The owner's cap: the owner messages cadence has counted, for the daily cap on triage replies
and the per-kind rate limit on operational notices.

Pure. One lives inside every `CadenceState` (rules/cadence.py), which folds `owner_message`
records into it (`apply`), prunes it on its own record clock (`sweep`), and compares the two
counts it answers (`triage_on_day`, `notices_within`) with the policy in its decisions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

from ntfy_intake.rules.timestamps import local_day, rfc3339, window_end

Alive = Callable[[float], bool]  # whether an entry of this `ts` is inside the retention window


class OwnerCap:
    """Queued owner messages, oldest first: triage replies by key, notices by kind then key."""

    __slots__ = ("_escalations", "_notices", "_triage")

    def __init__(
        self,
        triage: OrderedDict[str, float] | None = None,
        notices: dict[str, OrderedDict[str, float]] | None = None,
        escalations: OrderedDict[str, float] | None = None,
    ) -> None:
        self._triage = OrderedDict() if triage is None else triage  # key -> ts
        self._notices = {} if notices is None else notices  # kind -> (key -> ts)
        # The daemon's own messages for a silent agent (rules/escalation.py): their own daily
        # cap, so they never eat the triage cap nor it theirs.
        self._escalations = OrderedDict() if escalations is None else escalations  # key -> ts

    def fork(self) -> OwnerCap:
        """An independent copy (entries are immutable, so this copies only the indexes)."""
        return OwnerCap(
            OrderedDict(self._triage),
            {kind: OrderedDict(keys) for kind, keys in self._notices.items()},
            OrderedDict(self._escalations),
        )

    @property
    def size(self) -> int:
        """Entries held (counted owner messages, counted notices)."""
        return (
            len(self._triage)
            + len(self._escalations)
            + sum(len(keys) for keys in self._notices.values())
        )

    def apply(self, record: Mapping[str, Any], ts: float) -> bool:
        """Fold an `owner_message` record whose `ts` parsed to `ts`; False when it is malformed."""
        key = record.get("key")
        result = record.get("result")
        # Records written before message_kind existed are triage replies: counting them is the
        # safe direction for the cap.
        message_kind = record.get("message_kind", "triage")
        notice = record.get("notice")
        if (
            not isinstance(key, str)
            or not isinstance(result, str)
            or message_kind not in ("triage", "notice", "escalation")
            or (message_kind == "notice" and not isinstance(notice, str))
        ):
            return False
        if result == "queued":
            if message_kind == "triage":
                self._triage.setdefault(key, ts)
            elif message_kind == "escalation":
                self._escalations.setdefault(key, ts)
            elif isinstance(notice, str):
                self._notices.setdefault(notice, OrderedDict()).setdefault(key, ts)
        return True

    def sweep(self, alive: Alive, *, everything: bool) -> None:
        """Drop the entries `alive` refuses: only the front of each index (records arrive in time
        order), or, `everything`, the few a clock step left behind too."""
        if everything:
            self._triage = OrderedDict((k, v) for k, v in self._triage.items() if alive(v))
            self._escalations = OrderedDict(
                (k, v) for k, v in self._escalations.items() if alive(v)
            )
            for kind in list(self._notices):
                kept = OrderedDict((k, v) for k, v in self._notices[kind].items() if alive(v))
                self._notices[kind] = kept
        else:
            _sweep_front(self._triage, alive)
            _sweep_front(self._escalations, alive)
            for keys in self._notices.values():
                _sweep_front(keys, alive)
        for kind in [kind for kind, keys in self._notices.items() if not keys]:
            del self._notices[kind]

    def triage_on_day(self, day: date, timezone: str) -> int:
        """Queued triage owner messages on calendar day `day` in `timezone`."""
        return sum(1 for ts in self._triage.values() if local_day(ts, timezone) == day)

    def escalations_on_day(self, day: date, timezone: str) -> int:
        """Queued escalation owner messages on calendar day `day` in `timezone`."""
        return sum(1 for ts in self._escalations.values() if local_day(ts, timezone) == day)

    def notices_within(self, notice: str, moment: float, window: float) -> int:
        """Queued notices of kind `notice` whose `window` has not closed at `moment`."""
        return sum(
            1 for ts in self._notices.get(notice, {}).values() if moment < window_end(ts, window)
        )

    def snapshot(self, alive: Alive) -> dict[str, Any]:
        """The `triage_messages` and `notices` of `CadenceState.snapshot`."""
        return {
            "triage_messages": sorted(
                [rfc3339(ts), key] for key, ts in self._triage.items() if alive(ts)
            ),
            "notices": {
                kind: kept
                for kind, keys in sorted(self._notices.items())
                if (kept := sorted([rfc3339(ts), key] for key, ts in keys.items() if alive(ts)))
            },
        }


def _sweep_front(index: OrderedDict[str, float], alive: Alive) -> None:
    while index:
        key, ts = next(iter(index.items()))
        if alive(ts):
            break
        del index[key]
