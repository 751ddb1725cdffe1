"""The drill's plan: which faults, kills and restarts happen in which daemon lifetime, drawn
from one seeded random generator so a failing plan can be replayed with `--seed`."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from ntfy_intake.testbed.drill_parts import (
    CRASH_POINTS,
)

# -- the plan --------------------------------------------------------------------------------------

End = Literal["kill", "crash", "term"]


@dataclass
class Phase:
    """One daemon lifetime: start (maybe armed with a crash point), run, end."""

    end: End
    crash_at: str | None = None
    early: float | None = None  # a random kill this many seconds after start, caught up or not
    before: list[str] = field(default_factory=list)  # faults armed before the start
    during: list[str] = field(default_factory=list)  # faults while it runs

    def describe(self) -> str:
        if self.end == "crash":
            return f"crash at {self.crash_at}"
        if self.end == "kill":
            return "kill -9" + (f" {self.early:.2f} s after start" if self.early else "")
        return "SIGTERM"


BEFORE_FAULTS = ("force_400", "duplicate_at_subscribe", "cache_lag")
EMULATOR_DURING = ("evict", "silence", "swap_next_live", "scheduled")
RECEIVER_DURING = ("receiver_down", "receiver_503")


def build_plan(kills: int, rng: random.Random, *, emulator: bool) -> list[Phase]:
    """Seeded: which lifetimes end how, and which faults land where."""
    n_crash = min(kills, max(len(CRASH_POINTS), kills // 3))
    n_random = kills - n_crash
    phases = [
        Phase("crash", crash_at=f"{CRASH_POINTS[i % len(CRASH_POINTS)]}:{rng.randint(1, 4)}")
        for i in range(n_crash)
    ]
    phases += [
        Phase("kill", early=rng.uniform(0.05, 0.8) if i % 3 == 2 else None) for i in range(n_random)
    ]
    phases += [Phase("term") for _ in range(max(1, round(kills / 5)))]
    rng.shuffle(phases)
    # The first lifetime is the first start: nothing to recover, no cursor, no crash point.
    phases.insert(0, Phase("kill" if n_random else "term"))
    if n_random:
        # That first kill is one of the requested random kills.
        del phases[next(i for i, p in enumerate(phases) if i and p.end == "kill" and not p.early)]
    during = [*(EMULATOR_DURING if emulator else ()), *RECEIVER_DURING]
    hosts = [i for i, p in enumerate(phases) if i > 0 and p.end != "crash" and p.early is None]
    while len(hosts) < len(during):
        phases.append(Phase("term"))
        hosts.append(len(phases) - 1)
    for fault, index in zip(during, rng.sample(hosts, len(during)), strict=True):
        phases[index].during.append(fault)
    if emulator:
        later = list(range(1, len(phases)))
        for fault in BEFORE_FAULTS:
            phases[rng.choice(later)].before.append(fault)
    return phases
