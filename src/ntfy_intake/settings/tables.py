"""An array of tables in the config file (`[[maintenance]]`, `[[expect]]`): the checks every
such section shares, so each section's module reads only its own keys.

Shared here: the value is a list of tables; at most `most` entries; no unknown key (with a
"did you mean" for a near miss); `name` required, printable, unique across the entries. Every
problem is reported at once, each named `section[N].key` (N counts from 0 in file order), and
a section with any problem yields no entries, so a half-read section never takes effect.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ntfy_intake.errors import ConfigError
from ntfy_intake.settings.sources import _type_name

T = TypeVar("T")
MAX_NAME = 64
_PLAIN_KEY = re.compile(r"[-A-Za-z0-9_]{1,40}")


@dataclass(slots=True)
class At:
    """One entry being read: `fail` records a problem on one of its keys; `count` is how many
    it has had (a reader checks a group of keys by the count before and after it)."""

    section: str
    index: int
    problems: list[ConfigError]
    count: int = field(default=0)

    def fail(self, key: str, problem: str) -> None:
        self.count += 1
        self.problems.append(error(self.section, self.index, key, problem))


def read(
    section: str,
    raw: object,
    *,
    keys: Sequence[str],
    most: int,
    noun: str,
    name_says: str,
    entry: Callable[[Mapping[str, object], At, str | None], T | None],
) -> tuple[tuple[T, ...], list[ConfigError]]:
    """The entries of `raw` (the section's TOML value) read by `entry`, and every problem.
    `entry` is called for every table with its checked name (None when it failed), and its value is kept only when
    the table had no problem. `name_says`: what a missing `name` would have named."""
    if raw is None:
        return (), []
    if not isinstance(raw, list) or not all(isinstance(table, dict) for table in raw):
        return (), [
            error(section, None, None, f"expected [[{section}]] entries (an array of tables)")
        ]
    problems: list[ConfigError] = []
    if len(raw) > most:
        problems.append(error(section, None, None, f"at most {most} {noun}, got {len(raw)}"))
    found: list[T] = []
    seen: dict[str, int] = {}
    for index, table in enumerate(raw):
        at = At(section, index, problems)
        _unknown_keys(table, keys, at)
        name = _name(table.get("name"), at, name_says)
        value = entry(table, at, name)
        if name is not None and name in seen:
            at.fail("name", f"{name!r} is already the name of {section}[{seen[name]}]")
        elif name is not None:
            seen[name] = index
        if value is not None and at.count == 0:
            found.append(value)
    return (tuple(found) if not problems else ()), problems


def error(section: str, index: int | None, key: str | None, problem: str) -> ConfigError:
    where = section if index is None else f"{section}[{index}]"
    return ConfigError(where if key is None else f"{where}.{key}", problem)


def show(text: str) -> str:
    """A value quoted for a message, cut at 60 characters."""
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."


def _unknown_keys(table: Mapping[str, object], keys: Sequence[str], at: At) -> None:
    for key in table:
        if key not in keys:
            match = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
            hint = f" (did you mean {match[0]}?)" if match else ""
            shown = key if _PLAIN_KEY.fullmatch(key) else repr(key[:40])
            at.fail(shown, f"unknown key{hint}")


def _name(raw: object, at: At, says: str) -> str | None:
    if raw is None:
        at.fail("name", f"required: {says}")
        return None
    if not isinstance(raw, str):
        at.fail("name", f"expected a string, got {_type_name(raw)}")
        return None
    if not raw or raw != raw.strip() or len(raw) > MAX_NAME or not raw.isprintable():
        at.fail(
            "name",
            f"1-{MAX_NAME} printable characters without leading or trailing spaces,"
            f" got {show(raw)}",
        )
        return None
    return raw
