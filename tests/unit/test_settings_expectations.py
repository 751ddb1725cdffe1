"""`[[expect]]` in the config file: what is read, what is refused (every problem of every entry
at once, with the other sections' problems, each named `expect[N].key`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ntfy_intake import settings
from ntfy_intake.errors import ConfigError

HEAD = '[ntfy]\nurl = "https://ntfy.example.com"\ntopics = ["alerts", "backups"]\n'


@pytest.fixture(autouse=True)
def private_umask() -> Iterator[None]:
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def load(tmp_path: Path, text: str) -> settings.Settings:
    path = tmp_path / "config.toml"
    path.write_text(HEAD + "\n" + text)
    return settings.load(path, {})


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    found = info.value.errors if isinstance(info.value, settings.ConfigErrors) else [info.value]
    lines = [str(error) for error in found]
    assert all("\n" not in line for line in lines)
    return lines


def test_a_nightly_backup_and_a_monitor_are_read(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        """
[[expect]]
name = "nightly-backup"
topic = "backups"
title = "Backup  FINISHED"
every = "24h"
grace = "1h"

[[expect]]
name = "kuma"
topic = "alerts"
every = "10m"
""",
    )
    backup, kuma = loaded.expect
    assert (backup.name, backup.topic, backup.title) == (
        "nightly-backup",
        "backups",
        "backup finished",
    )
    assert (backup.every, backup.grace) == (86400.0, 3600.0)
    # No grace given: a tenth of `every`, so a job that ran a little long is not missed.
    assert (kuma.every, kuma.grace, kuma.title) == (600.0, 60.0, None)


def test_absent_means_none(tmp_path: Path) -> None:
    assert load(tmp_path, "").expect == ()


def test_every_problem_is_reported_at_once_with_the_other_sections(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """
[cadence]
debounce = "soon"

[[expect]]
name = "backup"
topic = "nope"
every = "1d1d"
grace = 5
tittle = "x"

[[expect]]
name = "backup"
topic = ["alerts"]
every = "500ms"

[[expect]]
topic = "alerts"
title = 3
""",
    )
    text = "\n".join(found)
    for fragment in (
        "cadence.debounce",
        "expect[0].topic: 'nope' is not one of ntfy.topics",
        "expect[0].every:",
        "expect[0].grace: expected a duration string",
        "expect[0].tittle: unknown key (did you mean title?)",
        "expect[1].name: 'backup' is already the name of expect[0]",
        "expect[1].topic: expected a string (one topic per [[expect]] entry)",
        "expect[1].every: at least 1s",
        "expect[2].name: required",
        "expect[2].title: expected a string",
        "expect[2].every: required",
    ):
        assert fragment in text, (fragment, found)
    assert len(found) == 11, found


def test_a_table_instead_of_an_array_of_tables_is_refused(tmp_path: Path) -> None:
    found = problems(tmp_path, '[expect]\nname = "x"\n')
    assert found == ["config error: expect: expected [[expect]] entries (an array of tables)"]


ROOT = Path(__file__).resolve().parents[2]


def test_the_commented_sample_and_the_guides_example_load(tmp_path: Path) -> None:
    sample = (ROOT / "deploy" / "config.example.toml").read_text()
    start = sample.index("#   [[expect]]")
    block = [line[4:] for line in sample[start:].splitlines() if line.startswith("#   ")]
    (backup,) = load(tmp_path, "\n".join(block)).expect
    assert (backup.name, backup.topic, backup.every, backup.grace) == (
        "nightly-backup",
        "backups",
        86400.0,
        3600.0,
    )
    doc = (ROOT / "docs" / "publishing.md").read_text()
    example = doc[doc.index("```toml\n[[expect]]") + len("```toml\n") :]
    (same,) = load(tmp_path, example[: example.index("```")]).expect
    assert same == backup
