"""`[[maintenance]]` in the config file: what is read, what is refused (every problem at once,
each named `maintenance[N].key`), and that nothing else changes when it is absent."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake import settings
from ntfy_intake.errors import ConfigError
from ntfy_intake.rules.maintenance import END_OF_DAY

HEAD = '[ntfy]\nurl = "https://ntfy.example.com"\ntopics = ["alerts", "nas1", "nas2", "backup", "backups"]\n'


@pytest.fixture(autouse=True)
def private_umask() -> Iterator[None]:
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> settings.Settings:
    path = tmp_path / "config.toml"
    path.write_text(text + "\n" + HEAD)  # a top-level key must come before the first table
    return settings.load(path, environ or {})


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    found = info.value.errors if isinstance(info.value, settings.ConfigErrors) else [info.value]
    lines = [str(error) for error in found]
    assert all("\n" not in line for line in lines)
    return lines


BACKUP = """
[cadence]
timezone = "Europe/Berlin"

[[maintenance]]
name = "sunday-backup"
topics = ["nas*", "backup"]
days = ["sun"]
from = "01:00"
to = "04:00"
timezone = "Europe/Amsterdam"

[[maintenance]]
name = "nightly reindex"
incidents = ["search:*"]
days = "daily"
from = "23:30"
to = "00:30"

[[maintenance]]
name = "weekdays"
topics = ["alerts"]
incidents = ["alerts:cron*"]
days = ["Monday", "tue", "WED", "thu", "fri"]
from = 12:00:00
to = "24:00"
"""


def test_maintenance_windows_are_read_from_the_config_file(tmp_path: Path) -> None:
    backup, nightly, weekdays = load(tmp_path, BACKUP).maintenance
    assert (backup.name, backup.topics, backup.incidents) == (
        "sunday-backup",
        ("nas*", "backup"),
        (),
    )
    assert (backup.days, backup.start, backup.end) == (frozenset({6}), 60, 240)
    assert backup.timezone == "Europe/Amsterdam"
    assert backup.reason == "maintenance:sunday-backup"
    # The default zone is the cadence's.
    assert (nightly.timezone, nightly.days, nightly.start, nightly.end) == (
        "Europe/Berlin",
        frozenset(range(7)),
        23 * 60 + 30,
        30,
    )
    assert weekdays.days == frozenset(range(5))
    assert (weekdays.start, weekdays.end) == (12 * 60, END_OF_DAY)


def test_no_maintenance_is_no_window_and_environment_only_works_as_before(tmp_path: Path) -> None:
    assert load(tmp_path, "").maintenance == ()
    env = {"NTFY_INTAKE_NTFY_URL": "https://ntfy.example.com", "NTFY_INTAKE_NTFY_TOPICS": "a"}
    assert settings.load(None, env).maintenance == ()


BROKEN = """
[[maintenance]]
name = "backup"
topics = ["nsa*"]
days = ["sun", "sundy"]
from = "1:00"
to = "25:00"
timezone = "Europe/Amsterdm"
colour = "red"

[[maintenance]]
name = "backup"
topics = ["nas1"]
days = "daily"
from = "02:00"
to = "03:00"

[[maintenance]]
days = []
from = "02:00"
to = "02:00"

[[maintenance]]
name = " padded"
topics = "nas1"
incidents = [""]
days = "weekly"
from = "24:00"
to = 3
"""


def test_every_maintenance_problem_is_reported_at_once_named_by_index_and_key(
    tmp_path: Path,
) -> None:
    found = problems(tmp_path, BROKEN)
    expected = [
        "maintenance[0].colour: unknown key",
        "maintenance[0].topics: 'nsa*' matches none of ntfy.topics",
        "maintenance[0].days: item 1: expected one of mon, tue, wed, thu, fri, sat, sun, got 'sundy'",
        "maintenance[0].from: expected a time of day HH:MM",
        "maintenance[0].to: no such time of day: '25:00'",
        "maintenance[0].timezone: unknown time zone 'Europe/Amsterdm'",
        "maintenance[1].name: 'backup' is already the name of maintenance[0]",
        "maintenance[2].name: required",
        "maintenance[2].topics: give topic or incident patterns",
        "maintenance[2].days: expected",
        "maintenance[2].to: must differ from `from`",
        "maintenance[3].name: 1-64 printable characters",
        'maintenance[3].topics: expected a list of patterns like ["nas1"], got a string',
        "maintenance[3].incidents: item 0: 1-400 printable characters",
        'maintenance[3].days: expected "daily" or a list of day names',
        "maintenance[3].to: expected a time of day HH:MM",
        "maintenance[3].from: 24:00 is only for `to`",
    ]
    for start in expected:
        assert any(line.startswith("config error: " + start) for line in found), (start, found)
    # Nothing else, no duplicate: one line per problem.
    assert len(found) == len(expected), found


def test_maintenance_problems_come_with_the_other_sections_problems(tmp_path: Path) -> None:
    text = '[relay]\nmax_attempts = 0\n[[maintenance]]\nname = "x"\ntopics = ["alerts"]\n'
    found = problems(tmp_path, text)
    assert any(line.startswith("config error: relay.max_attempts") for line in found)
    assert any(line.startswith("config error: maintenance[0].days: required") for line in found)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[maintenance]\nname = "x"\n', "maintenance: expected [[maintenance]] entries"),
        ('maintenance = ["x"]\n', "maintenance: expected [[maintenance]] entries"),
        (
            '[[maintenance]]\nname = "x"\ntopics = ["alerts"]\ndays = "daily"\n'
            "from = 01:00:30\nto = 02:00:00\n",
            "maintenance[0].from: whole minutes only",
        ),
        (
            '[[maintenance]]\nname = "x\\u0007"\ntopics = ["alerts"]\ndays = "daily"\n'
            'from = "01:00"\nto = "02:00"\n',
            "maintenance[0].name: 1-64 printable characters",
        ),
        (
            '[[maintenance]]\nname = "x"\ntopics = ["al/erts"]\ndays = "daily"\n'
            'from = "01:00"\nto = "02:00"\n',
            "maintenance[0].topics: 'al/erts' is not a topic pattern",
        ),
        (
            '[[maintenance]]\nname = "x"\ntopics = ["alerts"]\ndays = "daily"\n'
            'from = "01:00"\nto = "02:00"\ntimezone = 1\n',
            "maintenance[0].timezone: expected an IANA time zone name",
        ),
    ],
)
def test_a_bad_maintenance_entry_is_one_line_naming_its_key(
    tmp_path: Path, text: str, says: str
) -> None:
    found = problems(tmp_path, text)
    assert any(line.startswith("config error: " + says) for line in found), found


def test_topic_patterns_are_not_checked_against_topics_when_ntfy_is_not_needed(
    tmp_path: Path,
) -> None:
    """`status` and `check` load without ntfy settings: a window naming topics still loads."""
    path = tmp_path / "config.toml"
    path.write_text(
        '[[maintenance]]\nname = "x"\ntopics = ["nas*"]\ndays = "daily"\n'
        'from = "01:00"\nto = "02:00"\n'
    )
    (window,) = settings.load(path, {}, need_ntfy=False).maintenance
    assert window.topics == ("nas*",)


ROOT = Path(__file__).resolve().parents[2]


def test_the_commented_sample_window_and_the_docs_example_load(tmp_path: Path) -> None:
    sample = (ROOT / "deploy" / "config.example.toml").read_text()
    block = [line[4:] for line in sample.splitlines() if line.startswith("#   ")]
    assert block[0] == "[[maintenance]]", block
    (window,) = load(tmp_path, "\n".join(block)).maintenance
    assert (window.name, window.days, window.timezone) == (
        "sunday-backup",
        frozenset({6}),
        "Europe/Amsterdam",
    )
    doc = (ROOT / "docs" / "owner-messages.md").read_text()
    example = doc[doc.index("```toml\n[[maintenance]]") + len("```toml\n") :]
    (window,) = load(tmp_path, example[: example.index("```")]).maintenance
    assert (window.topics, window.incidents, window.start, window.end) == (
        ("backups",),
        ("alerts:nas*",),
        60,
        240,
    )
