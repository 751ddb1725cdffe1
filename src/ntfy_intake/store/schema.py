"""Kept for runtime/daemon.py's `migrations()` until it calls `migrations.apply`: the first steps
of the one list (migrations.py), which is where the daemon's tables are defined now.

`migrations()` concatenates `CORE`, `feed.FEED_MIGRATIONS` and `owner.OWNER_MIGRATIONS`; the
three are consecutive slices of `migrations.SQLITE`, so the concatenation is that list, in order.
"""

from __future__ import annotations

from ntfy_intake.store.migrations import SQLITE, Migration

CORE: list[Migration] = list(SQLITE[:2])
# Every step after the owner sender's (0005_console_reads, ...): `migrations()` appends them.
LATER: list[Migration] = list(SQLITE[4:])
