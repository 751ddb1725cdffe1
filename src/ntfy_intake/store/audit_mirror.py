"""Whether a node's audit files mirror the journal (DESIGN.md section 9), and what a node can no
longer get from it.

On PostgreSQL every node appends the shared journal to its own files (`audit.mirror`, and
`audit.flush` on the leader). The journal is kept for a window (retention.py); what retention
prunes, and what a rebuild from the audit log never put back, is only in the files of the nodes
that held it. The kv row `PRUNED_KEY` says up to which seq that is (forward only).

`compare` is the check the tests and `drill --standby` make of every node: above the seqs the
journal can no longer speak for (`floor`), a node's files must hold exactly the journal's rows:
the same seqs, each once, each line byte for byte the one `audit.file_line` makes of its row,
each file's lines in seq order and whole. Below the floor the files are history, not compared.
It reads the whole journal and every file: a check, not something for the daemon's loop.

`unreachable` is what a node that was down past the window (or starts with fresh files) needs
and the journal no longer holds; the standby's loop says so out loud.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ntfy_intake.store import audit, dialect
from ntfy_intake.store.transaction import Connection

PRUNED_KEY = "audit_journal_pruned_seq"
SHOWN = 10  # seqs named per kind in a mismatch's text

_ROWS_SQLITE = "SELECT seq, line, 0 FROM audit_journal WHERE seq > ? ORDER BY seq"
_ROWS_PG = "SELECT seq, line, term FROM audit_journal WHERE seq > ? ORDER BY seq"


def pruned_seq(conn: Connection) -> int:
    """The highest seq the journal no longer holds for certain (0: it holds all it ever had)."""
    row = conn.execute("SELECT value FROM kv WHERE name = ?", (PRUNED_KEY,)).fetchone()
    return int(row[0]) if row else 0


def note_pruned(conn: Connection, seq: int) -> None:
    """Inside a write transaction: journal rows at or below `seq` are gone from it."""
    audit.mark_forward(conn, PRUNED_KEY, seq)


def unreachable(conn: Connection, log: audit.AuditLog) -> tuple[int, int] | None:
    """(first, last): the seqs above this node's files that the journal was pruned of (or a
    rebuild never held), so mirroring cannot bring them; None when it holds all the files lack.
    Some of those numbers may never have been a row (a rolled-back transaction's). The lines
    are in the files of a node that was up then: with this node stopped, a copy of that node's
    audit directory in place of its own makes it whole (it mirrors on from the copy's end)."""
    top = log.last_seq
    pruned = pruned_seq(conn)
    return (top + 1, pruned) if pruned > top else None


@dataclass(frozen=True, slots=True)
class Mismatch:
    """How a node's files differ from the journal above `floor` (module doc)."""

    floor: int
    missing: tuple[int, ...] = ()  # journal rows no file holds
    extra: tuple[int, ...] = ()  # lines for which the journal has no row
    twice: tuple[int, ...] = ()  # seqs held more than once
    differing: tuple[int, ...] = ()  # held, but not as the journal's line
    unordered: tuple[str, ...] = ()  # files whose lines go back in seq
    unreadable: tuple[str, ...] = ()  # files with a torn or garbled line

    def __str__(self) -> str:
        parts = [
            f"{name} {_shown(values)}"
            for name, values in (
                ("missing", self.missing),
                ("extra", self.extra),
                ("twice", self.twice),
                ("differing", self.differing),
                ("unordered", self.unordered),
                ("unreadable", self.unreadable),
            )
            if values
        ]
        return f"audit files differ from the journal above seq {self.floor}: " + "; ".join(parts)


def _shown(values: tuple[int, ...] | tuple[str, ...]) -> str:
    shown = ", ".join(str(v) for v in values[:SHOWN])
    return f"{shown} (+{len(values) - SHOWN} more)" if len(values) > SHOWN else shown


def floor(conn: Connection) -> int:
    """The highest seq the journal cannot speak for: what retention pruned, what lies below its
    oldest row (a store copied in, a rebuild), and on SQLite what `flush` pruned."""
    lowest = conn.execute("SELECT min(seq) FROM audit_journal").fetchone()[0]
    below = audit.flushed_seq(conn) if lowest is None else int(lowest) - 1
    return max(pruned_seq(conn), below)


def compare(conn: Connection, directory: Path) -> Mismatch | None:
    """None when the files in `directory` mirror the journal (module doc), else how they differ."""
    start = floor(conn)
    expected = {
        int(seq): audit.file_line(int(seq), line, int(term))
        for seq, line, term in conn.execute(
            dialect.pick(conn, sqlite=_ROWS_SQLITE, postgresql=_ROWS_PG), (start,)
        )
    }
    held: dict[int, list[str]] = {}
    unordered: list[str] = []
    unreadable: list[str] = []
    for path in audit.log_files(directory):
        previous = 0
        for raw in path.read_bytes().splitlines(keepends=True):
            seq = _seq_of(raw)
            if seq is None:
                unreadable.append(path.name)
                continue
            if seq < previous and path.name not in unordered:
                unordered.append(path.name)
            previous = max(previous, seq)
            if seq > start:
                held.setdefault(seq, []).append(raw.decode("ascii", "replace"))
    found = Mismatch(
        floor=start,
        missing=tuple(sorted(set(expected) - set(held))),
        extra=tuple(sorted(set(held) - set(expected))),
        twice=tuple(sorted(seq for seq, lines in held.items() if len(lines) > 1)),
        differing=tuple(
            sorted(
                seq
                for seq, lines in held.items()
                if seq in expected and any(line != expected[seq] for line in lines)
            )
        ),
        unordered=tuple(unordered),
        unreadable=tuple(dict.fromkeys(unreadable)),
    )
    return None if found == Mismatch(floor=start) else found


def matches(conn: Connection, directory: Path) -> bool:
    """`compare` as a yes or no."""
    return compare(conn, directory) is None


def _seq_of(raw: bytes) -> int | None:
    """A whole line's seq; None for a torn (no newline) or garbled one."""
    if not raw.endswith(b"\n"):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    seq = value.get("seq") if isinstance(value, dict) else None
    return seq if isinstance(seq, int) else None
