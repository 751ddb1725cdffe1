"""Settings: the one place that reads configuration. This module loads; `schema` holds the
tree and its keys, `sources` the file, environment and secret-file readers, `rules` the
checks per section.

Settings reads (a TOML file and the environment mapping it is given).

Invariants owned here:
- `load` reads only the `environ` mapping passed in (never `os.environ`) and, besides the config file,
  `*_file`/`*_FILE` secret files and the host name (the default `[cluster] node`), touches nothing: no
  directory is created, no server is contacted;
- precedence per key: environment twin (`NTFY_INTAKE_<SECTION>_<KEY>` or its `_FILE`) > TOML (`key` or
  `key_file`) > default; an empty environment variable counts as unset;
- every problem is one `ConfigError` whose message is one line naming `section.key` (and the environment
  variable or `_file` key the bad value came from); a secret's value is never echoed; `load` reports
  every problem it finds at once (`ConfigErrors`, one line each), not only the first;
- the result is a tree of frozen dataclasses that is valid as a whole (cross-key rules checked here),
  so the rest of the daemon never re-validates configuration.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path

from ntfy_intake.errors import ConfigError
from ntfy_intake.settings import expectations as _expectations
from ntfy_intake.settings import maintenance as _maintenance
from ntfy_intake.settings.cluster import _cluster, _cluster_fits
from ntfy_intake.settings.rules import (
    _cadence,
    _health,
    _http,
    _ntfy,
    _owner,
    _Reader,
    _relay,
    _state,
)
from ntfy_intake.settings.schema import (
    _KINDS,
    _SECTIONS,
    ALL_KEYS,
    CONFIG_ENV,
    DEFAULT_CONFIG,
    SECRET_KEYS,
    CadenceSettings,
    ClusterSettings,
    FirstStart,
    HealthSettings,
    HttpSettings,
    NtfySettings,
    OwnerSettings,
    RelaySettings,
    Settings,
    StateSettings,
    T,
    env_name,
    split_listen,
)
from ntfy_intake.settings.sources import (
    ConfigErrors,
    _check_private,
    _env_values,
    _Problems,
    _read_toml,
    _resolve_file,
    _toml_values,
    _Value,
    secret_from,
)

__all__ = [
    "ALL_KEYS",
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "CadenceSettings",
    "ClusterSettings",
    "ConfigErrors",
    "FirstStart",
    "HealthSettings",
    "HttpSettings",
    "NtfySettings",
    "OwnerSettings",
    "RelaySettings",
    "Settings",
    "StateSettings",
    "config_path",
    "env_name",
    "load",
    "secret_from",
    "split_listen",
]


def config_path(given: Path | None, environ: Mapping[str, str]) -> Path | None:
    """The config file the CLI reads: `--config`, else `$NTFY_INTAKE_CONFIG`, else
    /etc/ntfy-intake/config.toml when it exists, else none (environment only)."""
    if given is not None or environ.get(CONFIG_ENV):
        return given
    return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None


def load(
    path: Path | None,
    environ: Mapping[str, str],
    *,
    need_ntfy: bool = True,
    allow_insecure_permissions: bool = False,
) -> Settings:
    """Build Settings from the TOML file at `path` (else `$NTFY_INTAKE_CONFIG`, else none) and `environ`.

    A config file holding a secret inline, or a secret file, that group or others can read is
    refused (as ssh refuses such a key) unless `allow_insecure_permissions`.

    `need_ntfy=False` is for commands that only read the state directory (status, check,
    redrive, feed): a missing `ntfy.url` or `ntfy.topics` is then no error. Every problem found
    is reported at once (`ConfigErrors` when there are several).
    """
    values: dict[tuple[str, str], _Value] = {}
    problems = _Problems()
    config_label = "config"
    windows: object = None  # `[[maintenance]]`: file only, read after the sections
    expect: object = None  # `[[expect]]`: likewise
    if path is None and environ.get(CONFIG_ENV):
        path, config_label = Path(environ[CONFIG_ENV]), f"config ({CONFIG_ENV})"
    if path is not None:
        doc = _read_toml(path, config_label)  # an unreadable file hides everything else: stop
        windows = doc.pop(_maintenance.SECTION, None)
        expect = doc.pop(_expectations.SECTION, None)
        toml = _toml_values(doc, path.parent, problems)
        inline = sorted(
            f"{s}.{k}" for (s, k), v in toml.items() if (s, k) in SECRET_KEYS and v.file is None
        )
        if inline and not allow_insecure_permissions:
            _check_private(path, config_label, f"holds {inline[0]}")
        values.update(toml)
    values.update(_env_values(environ, problems))
    resolved: dict[tuple[str, str], _Value] = {}
    for name, value in values.items():
        check = name in SECRET_KEYS and not allow_insecure_permissions
        done = problems.attempt(functools.partial(_resolve_file, value, check=check))
        if done is not None:
            resolved[name] = done
    build = _Builder(resolved, problems)
    ntfy = build.section("ntfy", lambda r: _ntfy(r, required=need_ntfy))
    state = build.section("state", lambda r: _state(r, environ))
    # Given at all, even unreadable or bad (reported at the key): the operator meant PostgreSQL.
    postgres = ("state", "database") in values
    cluster = build.section("cluster", lambda r: _cluster(r, postgres=postgres))
    problems.attempt(
        functools.partial(_cluster_fits, _Reader(resolved), cluster, postgres=postgres)
    )
    relay = build.section("relay", _relay)
    cadence = build.section("cadence", _cadence)
    # The owner rules compare with ntfy.topics; with broken ntfy settings, check them alone.
    known_ntfy = ntfy or _ntfy(_Reader({}), required=False)
    owner = build.section("owner", lambda r: _owner(r, known_ntfy))
    http = build.section("http", _http)
    health = build.section("health", _health)
    maintenance, trouble = _maintenance.parse(
        windows,
        default_timezone=cadence.timezone if cadence else "UTC",
        topics=ntfy.topics if ntfy else (),
    )
    for error in trouble:
        problems.add(error)
    expected, trouble = _expectations.parse(expect, topics=ntfy.topics if ntfy else ())
    for error in trouble:
        problems.add(error)
    problems.raise_any()
    assert ntfy and state and cluster and relay and cadence and owner and http and health
    return Settings(
        ntfy=ntfy,
        state=state,
        cluster=cluster,
        relay=relay,
        cadence=cadence,
        owner=owner,
        http=http,
        health=health,
        maintenance=maintenance,
        expect=expected,
    )


# Stand-ins for a bad required key while the rest of its section is checked (never returned).
_STAND_INS = {("ntfy", "url"): "http://127.0.0.1", ("ntfy", "topics"): "stand-in"}


class _Builder:
    """Builds one section at a time and, when a key is bad, builds it again without that key
    (its default applies, or a stand-in when it is required), so every bad key of the section is
    reported, not only the first. An error that only follows from a key already reported bad
    (it names that key) is not reported again."""

    def __init__(self, values: Mapping[tuple[str, str], _Value], problems: _Problems) -> None:
        self.values = dict(values)
        self.problems = problems
        self.reported: set[tuple[str, str]] = set()
        self.said: list[ConfigError] = []

    def section(self, name: str, build: Callable[[_Reader], T]) -> T | None:
        for _ in range(len(_SECTIONS[name]) + 1):
            try:
                return build(_Reader(self.values))
            except ConfigError as exc:
                key = _key_of(exc)
                follows = any(f"{s}.{k}" in exc.problem for s, k in self.reported)
                said = key is not None and any(f"{key[0]}.{key[1]}" in e.problem for e in self.said)
                if key not in self.reported and not (follows or said):
                    self.problems.add(exc)
                    self.said.append(exc)
                if key is None or key in self.reported:
                    return None  # a rule we cannot route, or no progress: stop here
                self.reported.add(key)
                if key in _STAND_INS:
                    self.values[key] = _Value(exc.key, _STAND_INS[key], textual=True)
                else:
                    self.values.pop(key, None)
        return None


def _key_of(error: ConfigError) -> tuple[str, str] | None:
    """`ntfy.url (NTFY_INTAKE_NTFY_URL)` -> ("ntfy", "url")."""
    section, _, key = error.key.split(" ")[0].partition(".")
    return (section, key) if (section, key) in _KINDS else None
