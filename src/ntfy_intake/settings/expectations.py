"""`[[expect]]`: a dead-man switch per publisher (DESIGN.md section 12; the rule is
rules/expectations.py). Read from the config file only (an array of tables has no environment
twin), every problem of every entry reported at once, each named `expect[N].key` (N counts from
0 in file order).

    [[expect]]
    name = "nightly-backup"
    topic = "backups"            # one of ntfy.topics
    title = "backup finished"    # optional: a substring of the title, any case
    every = "24h"
    grace = "1h"                 # optional; default: a tenth of `every`
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from ntfy_intake.errors import ConfigError
from ntfy_intake.rules.durations import parse_duration
from ntfy_intake.rules.expectations import Expectation, normalize_title
from ntfy_intake.settings import tables
from ntfy_intake.settings.sources import _type_name as _type

SECTION = "expect"
KEYS = ("name", "topic", "title", "every", "grace")
MAX_TITLE = 200
MAX_ENTRIES = 64
# Shorter would be a poll, not a publisher's schedule (and a notice storm when it is wrong).
MIN_EVERY = 1.0
# The default grace: a job that ran a little longer than last time is not missed.
DEFAULT_GRACE_SHARE = 0.1
_TOPIC = re.compile(r"[-_A-Za-z0-9]{1,64}")  # settings.schema.TOPIC_RE
_Fail = Callable[[str, str], None]


def parse(
    raw: object, *, topics: Sequence[str] = ()
) -> tuple[tuple[Expectation, ...], list[ConfigError]]:
    """The expectations of the `expect` value of a TOML document, and every problem found.
    `topics`: `ntfy.topics` when known; a topic outside them would never be heard from, and the
    owner would be told every window that it was missed."""
    return tables.read(
        SECTION,
        raw,
        keys=KEYS,
        most=MAX_ENTRIES,
        noun="entries",
        name_says="it names the expectation in notices and on the console",
        entry=lambda table, at, name: _entry(table, at, name, topics),
    )


def _entry(
    entry: Mapping[str, object], at: tables.At, name: str | None, known_topics: Sequence[str]
) -> Expectation | None:
    fail = at.fail
    topic = _topic(entry.get("topic"), known_topics, fail)
    title = _title(entry.get("title"), fail)
    every = _duration(entry.get("every"), "every", fail, required=True)
    if every is not None and every < MIN_EVERY:
        fail("every", f"at least {MIN_EVERY:g}s, got {entry.get('every')!r}")
        every = None
    grace = _duration(entry.get("grace"), "grace", fail, required=False)
    if at.count:
        return None
    assert name is not None and topic is not None and every is not None
    if grace is None:
        grace = round(every * DEFAULT_GRACE_SHARE, 3)
    return Expectation(name, topic, every, grace, title)


def _topic(raw: object, known: Sequence[str], fail: _Fail) -> str | None:
    if raw is None:
        fail("topic", "required: the ntfy topic the publisher sends to")
        return None
    if not isinstance(raw, str):
        hint = " (one topic per [[expect]] entry)" if isinstance(raw, list) else ""
        fail("topic", f"expected a string{hint}, got {_type(raw)}")
        return None
    if not _TOPIC.fullmatch(raw):
        fail("topic", f"{tables.show(raw)} is not a topic name (1-64 of A-Z a-z 0-9 - _)")
        return None
    if known and raw not in known:
        fail("topic", f"{raw!r} is not one of ntfy.topics: it would never be heard from")
        return None
    return raw


def _title(raw: object, fail: _Fail) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        fail("title", f"expected a string, got {_type(raw)}")
        return None
    title = normalize_title(raw)
    if not title or len(title) > MAX_TITLE or not title.isprintable():
        fail("title", f"1-{MAX_TITLE} printable characters, got {tables.show(raw)}")
        return None
    return title


def _duration(raw: object, key: str, fail: _Fail, *, required: bool) -> float | None:
    if raw is None:
        if required:
            fail(key, 'required: a duration like "24h"')
        return None
    if not isinstance(raw, str):
        fail(key, f'expected a duration string like "24h", got {_type(raw)}')
        return None
    try:
        return parse_duration(raw)
    except ValueError as exc:
        fail(key, str(exc))
        return None
