"""The audit files as they are read back: torn tails cut, seqs found, records parsed.

Every reader goes by `seq` across all files, never by file names or the clock (a clock that
stepped back writes newer lines into an older day's file); each file's lines are in seq order,
so the newest seqs are found by reading a file from its end only as far as needed. Torn or
garbled lines are skipped on read, unknown keys (`term`, written on PostgreSQL) are kept,
and only regular files count: anything else under an audit name is not a log this process
wrote.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

FILE_PREFIX = "audit-"
FILE_SUFFIX = ".jsonl"


def repair_tails(directory: Path) -> int:
    """Cut a torn last line off every audit file; return the highest seq in any of them."""
    top = 0
    for path in log_files(directory):
        _truncate_torn_tail(path)
        for record in _reverse_records(path):
            seq = record.get("seq")
            if isinstance(seq, int):
                top = max(top, seq)
                break
    return top


def seqs_above(directory: Path, mark: int) -> set[int]:
    """Every seq above `mark` in any file (each file's lines are in seq order: read from its
    end only as far as needed)."""
    found: set[int] = set()
    for path in log_files(directory):
        found.update(_seqs_above(path, mark))
    return found


def _truncate_torn_tail(path: Path) -> None:
    """A crash mid-write leaves a last line without its newline; it is still in the journal."""
    with path.open("rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        block = 65536
        position = size
        while position > 0:
            start = max(0, position - block)
            handle.seek(start)
            chunk = handle.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                handle.truncate(start + newline + 1)
                break
            position = start
        else:
            handle.truncate(0)
        handle.flush()
        os.fsync(handle.fileno())


def _seqs_above(path: Path, mark: int) -> set[int]:
    """Seqs above `mark` at the end of a file, reading backwards only as far as needed."""
    found: set[int] = set()
    for record in _reverse_records(path):
        seq = record.get("seq")
        if not isinstance(seq, int) or seq <= mark:
            break
        found.add(seq)
    return found


def _reverse_records(path: Path) -> Iterator[Mapping[str, Any]]:
    with path.open("rb") as handle:
        position = handle.seek(0, os.SEEK_END)
        tail = b""
        while position > 0:
            start = max(0, position - 65536)
            handle.seek(start)
            tail = handle.read(position - start) + tail
            position = start
            lines = tail.split(b"\n")
            tail = lines[0]
            for raw in reversed(lines[1:]):
                record = _parse(raw)
                if record is not None:
                    yield record
        record = _parse(tail)
        if record is not None:
            yield record


def _parse(raw: bytes) -> Mapping[str, Any] | None:
    if not raw.strip():
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def log_files(directory: Path) -> list[Path]:
    """The audit files, oldest first. Only regular files: anything else (a device, a FIFO) under
    an audit name is not a log this process wrote, and reading it could block forever."""
    if not directory.exists():
        return []
    return sorted(p for p in directory.glob(f"{FILE_PREFIX}*{FILE_SUFFIX}") if p.is_file())


def read_records(directory: Path, *, since_day: str | None = None) -> Iterator[dict[str, Any]]:
    """Every record in file order, oldest file first; torn or garbled lines are skipped."""
    for path in log_files(directory):
        day = path.name[len(FILE_PREFIX) : -len(FILE_SUFFIX)]
        if since_day is not None and day < since_day:
            continue
        with path.open("rb") as handle:
            for raw in handle:
                record = _parse(raw)
                if record is not None:
                    yield dict(record)
