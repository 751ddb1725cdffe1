"""Settings: the one place that reads configuration (a TOML file and the environment mapping it is given).

Invariants owned here:
- `load` reads only the `environ` mapping passed in (never `os.environ`) and, besides the config file and
  `*_file`/`*_FILE` secret files, touches nothing: no directory is created, no server is contacted;
- precedence per key: environment twin (`NTFY_INTAKE_<SECTION>_<KEY>` or its `_FILE`) > TOML (`key` or
  `key_file`) > default; an empty environment variable counts as unset;
- every problem is one `ConfigError` whose message is one line naming `section.key` (and the environment
  variable or `_file` key the bad value came from); a secret's value is never echoed; `load` reports
  every problem it finds at once (`ConfigErrors`, one line each), not only the first;
- the result is a tree of frozen dataclasses that is valid as a whole (cross-key rules checked here),
  so the rest of the daemon never re-validates configuration.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import ipaddress
import math
import os
import re
import stat
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn, TypeVar
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ntfy_intake import signing
from ntfy_intake.durations import format_duration, parse_duration
from ntfy_intake.errors import ConfigError

__all__ = [
    "ALL_KEYS",
    "CONFIG_ENV",
    "CadenceSettings",
    "FirstStart",
    "HealthSettings",
    "HttpSettings",
    "NtfySettings",
    "OwnerSettings",
    "RelaySettings",
    "Settings",
    "StateSettings",
    "env_name",
    "load",
]

ENV_PREFIX = "NTFY_INTAKE_"
CONFIG_ENV = "NTFY_INTAKE_CONFIG"
TEST_ENV_PREFIX = "NTFY_INTAKE_TEST_"  # reserved for test hooks; never an error, never read here
DEFAULT_STATE_DIR = Path("/var/lib/ntfy-intake")
DEFAULT_CONFIG = Path("/etc/ntfy-intake/config.toml")  # used by the CLI when it exists
DELAYED_SENDER_PERIOD = 10.0  # ntfy publishes due scheduled messages every 10 s
# ntfy refuses these as topic names (server.go, disallowedTopics): they are its own URL paths.
DISALLOWED_TOPICS = frozenset(
    {"docs", "static", "file", "app", "metrics", "account", "settings", "signup", "login", "v1"}
)
TOPIC_RE = re.compile(r"[-_A-Za-z0-9]{1,64}")
PHONE_RE = re.compile(r"\+[1-9][0-9]{1,14}")  # E.164
GROUP_RE = re.compile(r"group\.[A-Za-z0-9+/]+={0,2}")  # signal-cli-rest-api group id
MAX_INT = 2**31 - 1
MAX_FILE_BYTES = 64 * 1024

Kind = Literal["str", "list", "duration", "int"]
T = TypeVar("T")
# Every (section, key) in file order, with how its raw value is typed. The dataclasses below must match.
_KINDS: dict[tuple[str, str], Kind] = {
    ("ntfy", "url"): "str",
    ("ntfy", "topics"): "list",
    ("ntfy", "token"): "str",
    ("ntfy", "cache_duration"): "duration",
    ("ntfy", "keepalive_interval"): "duration",
    ("ntfy", "keepalive_timeout"): "duration",
    ("ntfy", "dead_after"): "duration",
    ("ntfy", "reorder_window"): "duration",
    ("ntfy", "first_start"): "str",
    ("ntfy", "cache_settle"): "duration",
    ("ntfy", "overlap"): "duration",
    ("state", "dir"): "str",
    ("relay", "url"): "str",
    ("relay", "timeout"): "duration",
    ("relay", "max_attempts"): "int",
    ("relay", "secret"): "str",
    ("relay", "token"): "str",
    ("cadence", "debounce"): "duration",
    ("cadence", "cooldown"): "duration",
    ("cadence", "daily_cap"): "int",
    ("cadence", "timezone"): "str",
    ("owner", "signal_url"): "str",
    ("owner", "signal_number"): "str",
    ("owner", "recipients"): "list",
    ("owner", "fallback_topic"): "str",
    ("http", "listen"): "str",
    ("http", "token"): "str",
    ("health", "ping_url"): "str",
    ("health", "ping_interval"): "duration",
}
ALL_KEYS: tuple[tuple[str, str], ...] = tuple(_KINDS)
# A dead-man's-switch URL (healthchecks.io style) carries its check's secret in the path.
SECRET_KEYS = frozenset(
    {
        ("ntfy", "token"),
        ("http", "token"),
        ("health", "ping_url"),
        ("relay", "secret"),
        ("relay", "token"),
    }
)
_URL_KEYS = frozenset({("ntfy", "url"), ("relay", "url"), ("owner", "signal_url")})
_SECTIONS: dict[str, tuple[str, ...]] = {}
for _section, _key in ALL_KEYS:
    _SECTIONS.setdefault(_section, ())
    _SECTIONS[_section] += (_key,)


def env_name(section: str, key: str) -> str:
    """The environment twin of `section.key`: `NTFY_INTAKE_<SECTION>_<KEY>`."""
    return f"{ENV_PREFIX}{section.upper()}_{key.upper()}"


# ---------------------------------------------------------------------------------------------------
# The settings tree


@dataclass(frozen=True, slots=True)
class FirstStart:
    """Where a first start (no cursor yet) joins: at head, the whole cache, or `seconds` of history."""

    mode: Literal["now", "all", "history"]
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class NtfySettings:
    url: str
    topics: tuple[str, ...]
    token: str | None = dataclasses.field(repr=False)
    cache_duration: float
    keepalive_interval: float
    keepalive_timeout: float
    dead_after: float
    reorder_window: float
    first_start: FirstStart
    # The overlap backfill (DESIGN.md section 3): poll `since=<T - overlap>` once `cache_settle`
    # has passed after each `open`.
    cache_settle: float = 2.0
    overlap: float = 30.0


@dataclass(frozen=True, slots=True)
class StateSettings:
    dir: Path

    @property
    def database(self) -> Path:
        return self.dir / "intake.sqlite3"

    @property
    def audit_dir(self) -> Path:
        return self.dir / "audit"


@dataclass(frozen=True, slots=True)
class RelaySettings:
    url: str | None
    timeout: float
    max_attempts: int
    secret: str | None = dataclasses.field(
        default=None, repr=False
    )  # `whsec_...`: Standard Webhooks signing
    token: str | None = dataclasses.field(default=None, repr=False)  # optional receiver bearer

    @property
    def signing_key(self) -> bytes | None:
        return None if self.secret is None else signing.parse_secret(self.secret)


@dataclass(frozen=True, slots=True)
class CadenceSettings:
    debounce: float
    cooldown: float
    daily_cap: int
    timezone: str

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


@dataclass(frozen=True, slots=True)
class OwnerSettings:
    signal_url: str | None
    signal_number: str | None
    recipients: tuple[str, ...]
    fallback_topic: str | None


@dataclass(frozen=True, slots=True)
class HttpSettings:
    listen: str
    token: str | None = dataclasses.field(repr=False)

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]


@dataclass(frozen=True, slots=True)
class HealthSettings:
    ping_url: str | None = dataclasses.field(repr=False)  # dead-man's switch, pinged while healthy
    ping_interval: float


@dataclass(frozen=True, slots=True)
class Settings:
    ntfy: NtfySettings
    state: StateSettings
    relay: RelaySettings
    cadence: CadenceSettings
    owner: OwnerSettings
    http: HttpSettings
    health: HealthSettings

    def redacted(self) -> dict[str, object]:
        """Every key, JSON-able, for `status` and logs: secrets as "***" (None when unset), URL
        credentials masked, durations as duration strings."""
        out: dict[str, dict[str, object]] = {}
        for section, key in ALL_KEYS:
            value: object = getattr(getattr(self, section), key)
            if (section, key) in SECRET_KEYS:
                value = None if value is None else "***"
            elif (section, key) in _URL_KEYS:
                value = None if value is None else _mask_url(str(value))
            elif _KINDS[section, key] == "duration" and isinstance(value, float):
                value = format_duration(value)
            elif isinstance(value, FirstStart):
                value = _first_start_text(value)
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Path):
                value = str(value)
            out.setdefault(section, {})[key] = value
        return dict(out)


def split_listen(listen: str) -> tuple[str, int]:
    """`127.0.0.1:8788` / `[::1]:8788` / `localhost:8788` -> (host, port); ValueError on anything else."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port_text) or int(port_text) > 65535:
        raise ValueError("expected host:port like 127.0.0.1:8788 or [::1]:8788")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
        return host[1:-1], int(port_text)
    if ":" in host:
        raise ValueError("an IPv6 address needs brackets, like [::1]:8788")
    if not host:
        raise ValueError("the host is missing (use 0.0.0.0:PORT to listen on every interface)")
    if not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9]{0,62})(\.[A-Za-z0-9][-A-Za-z0-9]{0,62})*", host):
        raise ValueError(f"{host!r} is not an IP address or host name")
    return host, int(port_text)


# ---------------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True, slots=True)
class _Value:
    """One key's raw value and where it came from."""

    label: str  # "ntfy.url", or "ntfy.url (NTFY_INTAKE_NTFY_URL)", for error messages
    raw: object  # a TOML value, or the text of an environment variable or file
    textual: bool  # True when raw is text to parse (env, file), False for a typed TOML value
    trim: bool = False  # an env value: surrounding spaces are dropped (file content is exact)
    base: Path | None = None  # where a relative path in the TOML file is resolved from
    file: Path | None = None  # read raw from this file (a `_file` / `_FILE` indirection)


class ConfigErrors(ConfigError):
    """Several configuration problems, reported together: one `config error: key: ...` line each."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__(errors[0].key, errors[0].problem)
        self.args = ("\n".join(str(error) for error in errors),)

    def __str__(self) -> str:
        return str(self.args[0])


class _Problems:
    """Collects ConfigErrors so that one run of `load` reports all of them."""

    def __init__(self) -> None:
        self.errors: list[ConfigError] = []

    def add(self, error: ConfigError) -> None:
        found = error.errors if isinstance(error, ConfigErrors) else [error]
        for one in found:
            if str(one) not in {str(seen) for seen in self.errors}:
                self.errors.append(one)

    def attempt(self, build: Callable[[], T]) -> T | None:
        try:
            return build()
        except ConfigError as exc:
            self.add(exc)
            return None

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ConfigErrors(self.errors)


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
    if path is None and environ.get(CONFIG_ENV):
        path, config_label = Path(environ[CONFIG_ENV]), f"config ({CONFIG_ENV})"
    if path is not None:
        doc = _read_toml(path, config_label)  # an unreadable file hides everything else: stop
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
    state = build.section("state", lambda r: StateSettings(dir=_state_dir(r, environ)))
    relay = build.section("relay", _relay)
    cadence = build.section("cadence", _cadence)
    # The owner rules compare with ntfy.topics; with broken ntfy settings, check them alone.
    known_ntfy = ntfy or _ntfy(_Reader({}), required=False)
    owner = build.section("owner", lambda r: _owner(r, known_ntfy))
    http = build.section("http", _http)
    health = build.section("health", _health)
    problems.raise_any()
    assert ntfy and state and relay and cadence and owner and http and health
    return Settings(
        ntfy=ntfy,
        state=state,
        relay=relay,
        cadence=cadence,
        owner=owner,
        http=http,
        health=health,
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


def _read_toml(path: Path, label: str) -> dict[str, object]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(label, f"cannot read {_show_path(path)}: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(label, f"{_show_path(path)}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(label, f"{_show_path(path)}: invalid TOML: {exc}") from None


def _toml_values(
    doc: Mapping[str, object], base: Path, problems: _Problems
) -> dict[tuple[str, str], _Value]:
    values: dict[tuple[str, str], _Value] = {}
    for section, table in doc.items():
        if section not in _SECTIONS:
            where = "section" if isinstance(table, dict) else "top-level key (keys go in a section)"
            problems.add(
                ConfigError(_show_key(section), f"unknown {where}{_suggest(section, _SECTIONS)}")
            )
            continue
        if not isinstance(table, dict):
            problems.add(
                ConfigError(section, f"expected a table [{section}], got {_type_name(table)}")
            )
            continue
        keys = _SECTIONS[section]
        for key, raw in table.items():
            name = f"{section}.{key}"
            if key in keys:
                if f"{key}_file" in table:
                    problems.add(ConfigError(name, f"both {key} and {key}_file are set; use one"))
                    continue
                values[section, key] = _Value(name, raw, textual=False, base=base)
            elif key.endswith("_file") and key.removesuffix("_file") in keys:
                if key.removesuffix("_file") in table:
                    continue  # both set: reported once, at the plain key
                if not isinstance(raw, str) or not raw:
                    problems.add(
                        ConfigError(name, f"expected a file path string, got {_type_name(raw)}")
                    )
                    continue
                label = f"{section}.{key.removesuffix('_file')} ({name})"
                values[section, key.removesuffix("_file")] = _Value(
                    label, None, textual=True, file=base / raw
                )
            else:
                problems.add(
                    ConfigError(f"{section}.{_show_key(key)}", f"unknown key{_suggest(key, keys)}")
                )
    return values


def _env_values(environ: Mapping[str, str], problems: _Problems) -> dict[tuple[str, str], _Value]:
    known = {CONFIG_ENV}
    for section, key in ALL_KEYS:
        known |= {env_name(section, key), env_name(section, key) + "_FILE"}
    for name in sorted(environ):
        if (
            name.startswith(ENV_PREFIX)
            and name not in known
            and not name.startswith(TEST_ENV_PREFIX)
        ):
            problems.add(
                ConfigError(_show_key(name), f"unknown environment variable{_suggest(name, known)}")
            )
    values: dict[tuple[str, str], _Value] = {}
    for section, key in ALL_KEYS:
        name = env_name(section, key)
        direct, file = environ.get(name, ""), environ.get(name + "_FILE", "")
        if direct and file:
            problems.add(
                ConfigError(f"{section}.{key} ({name})", f"both {name} and {name}_FILE are set")
            )
            continue
        if direct:
            label = f"{section}.{key} ({name})"
            values[section, key] = _Value(label, direct, textual=True, trim=True)
        elif file:
            label = f"{section}.{key} ({name}_FILE)"
            values[section, key] = _Value(label, None, textual=True, file=Path(file))
    return values


INSECURE_HINT = "chmod 600 it, or pass --allow-insecure-permissions"


def _check_private(path: Path, label: str, holds: str = "holds a secret") -> None:
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(label, f"cannot stat {_show_path(path)}: {exc.strerror or exc}") from None
    _refuse_readable(mode, path, label, holds)


def _refuse_readable(mode: int, path: Path, label: str, holds: str = "holds a secret") -> None:
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        raise ConfigError(
            label,
            f"{_show_path(path)} {holds} and is readable by group or others "
            f"(mode {stat.S_IMODE(mode):04o}): {INSECURE_HINT}",
        )


def _resolve_file(value: _Value, *, check: bool = False) -> _Value:
    if value.file is None:
        return value
    where = _show_path(value.file)
    try:
        with value.file.open("rb") as handle:
            if check:
                _refuse_readable(os.fstat(handle.fileno()).st_mode, value.file, value.label)
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(value.label, f"cannot read {where}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(value.label, f"{where} is larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(value.label, f"{where} is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text
    if not text:
        raise ConfigError(value.label, f"{where} is empty")
    return dataclasses.replace(value, raw=text, file=None)


class _Reader:
    """Typed access to the merged raw values; every failure names the key and the value's origin."""

    def __init__(self, values: Mapping[tuple[str, str], _Value]) -> None:
        self._values = values

    def has(self, section: str, key: str) -> bool:
        return (section, key) in self._values

    def base(self, section: str, key: str) -> Path | None:
        """The config file's directory when the value came from it (relative paths start there)."""
        value = self._values.get((section, key))
        return None if value is None else value.base

    def label(self, section: str, key: str) -> str:
        value = self._values.get((section, key))
        return f"{section}.{key}" if value is None else value.label

    def fail(self, section: str, key: str, problem: str) -> NoReturn:
        raise ConfigError(self.label(section, key), " ".join(problem.splitlines()))

    def show(self, section: str, key: str, text: str) -> str:
        """How a bad value appears in a message: quoted, cut short, never when it is a secret."""
        if (section, key) in SECRET_KEYS:
            return "(value not shown)"
        if (section, key) in _URL_KEYS:
            text = _mask_url(text)
        return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."

    def text(self, section: str, key: str) -> str | None:
        value = self._values.get((section, key))
        if value is None:
            return None
        if not isinstance(value.raw, str):
            if (section, key) == ("ntfy", "first_start"):
                self._reject_number(section, key, value.raw, 'expected "now", "all" or a duration')
            self.fail(section, key, f"expected a string, got {_type_name(value.raw)}")
        return self._check_text(section, key, value.raw.strip() if value.trim else value.raw)

    def _check_text(self, section: str, key: str, text: str) -> str:
        if not text:
            self.fail(section, key, "must not be empty (leave the key out to use the default)")
        if not text.isprintable():
            self.fail(
                section,
                key,
                f"must not contain control characters: {self.show(section, key, text)}",
            )
        return text

    def strings(self, section: str, key: str) -> tuple[str, ...] | None:
        value = self._values.get((section, key))
        if value is None:
            return None
        if value.textual:
            assert isinstance(value.raw, str)
            items = [item.strip() for item in re.split(r"[,\n]", value.raw)]
            if not value.raw.strip():
                return ()
            if "" in items:
                self.fail(
                    section, key, f"empty item in the list {self.show(section, key, value.raw)}"
                )
        elif isinstance(value.raw, list):
            items = value.raw
            for index, item in enumerate(items):
                if not isinstance(item, str):
                    self.fail(
                        section, key, f"item {index}: expected a string, got {_type_name(item)}"
                    )
        else:
            hint = ' like ["a", "b"]' if isinstance(value.raw, str) else ""
            self.fail(
                section, key, f"expected a list of strings{hint}, got {_type_name(value.raw)}"
            )
        return tuple(self._check_text(section, key, item) for item in items)

    def duration(self, section: str, key: str) -> float | None:
        value = self._values.get((section, key))
        if value is None:
            return None
        if not isinstance(value.raw, str):
            self._reject_number(section, key, value.raw, "expected a duration string")
            self.fail(section, key, f"expected a duration like 45s, got {_type_name(value.raw)}")
        try:
            return parse_duration(value.raw)
        except ValueError as exc:
            self.fail(section, key, str(exc))

    def _reject_number(self, section: str, key: str, raw: object, expected: str) -> None:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            example = f"{raw:g}s" if math.isfinite(raw) and raw > 0 else "45s"
            self.fail(
                section,
                key,
                f"{expected}, got the bare number {raw!r}: use a duration like {example}",
            )

    def integer(self, section: str, key: str) -> int | None:
        value = self._values.get((section, key))
        if value is None:
            return None
        if value.textual:
            assert isinstance(value.raw, str)
            if not re.fullmatch(r"-?[0-9]{1,18}", value.raw.strip()):
                self.fail(
                    section, key, f"expected an integer, got {self.show(section, key, value.raw)}"
                )
            number = int(value.raw.strip())
        elif isinstance(value.raw, int) and not isinstance(value.raw, bool):
            number = value.raw
        else:
            self.fail(section, key, f"expected an integer, got {_type_name(value.raw)}")
        if number > MAX_INT:
            self.fail(section, key, f"must be at most {MAX_INT}, got {number}")
        return number


def _ntfy(r: _Reader, *, required: bool = True) -> NtfySettings:
    url = _url(r, "ntfy", "url", query=False)
    topics = r.strings("ntfy", "topics")
    if not required:
        url = "" if url is None else url
        topics = () if topics is None else topics
    where = (
        f"in the config file (--config PATH or {CONFIG_ENV}; default {DEFAULT_CONFIG}, "
        f"read when it exists)"
    )
    if url is None and topics is None:
        r.fail(
            "ntfy",
            "url",
            f"required, and so is ntfy.topics: no configuration found. Set them {where} or as "
            f"{env_name('ntfy', 'url')} and {env_name('ntfy', 'topics')}",
        )
    if url is None:
        r.fail(
            "ntfy", "url", f"required: the ntfy server URL, {where} or {env_name('ntfy', 'url')}"
        )
    if topics is None:
        r.fail(
            "ntfy", "topics", f"required: a list of topics, {where} or {env_name('ntfy', 'topics')}"
        )
    if not topics and required:
        r.fail("ntfy", "topics", "needs at least one topic")
    for topic in topics:
        _check_topic(r, "ntfy", "topics", topic)
    duplicates = sorted({topic for topic in topics if topics.count(topic) > 1})
    if duplicates:
        r.fail("ntfy", "topics", f"{duplicates[0]!r} is listed twice (ntfy would deliver it twice)")

    cache = _duration(r, "ntfy", "cache_duration", 12 * 3600.0, 0.0, strict=True)
    interval = _duration(r, "ntfy", "keepalive_interval", 45.0, 1.0)
    timeout = _duration(
        r,
        "ntfy",
        "keepalive_timeout",
        2.5 * interval,
        interval,
        strict=True,
        bound_by="ntfy.keepalive_interval",
    )
    # Unset dead_after follows a long keepalive_timeout instead of failing on a key nobody wrote.
    dead_after = _duration(
        r, "ntfy", "dead_after", max(300.0, timeout), timeout, bound_by="ntfy.keepalive_timeout"
    )
    reorder = _duration(r, "ntfy", "reorder_window", 5.0, 0.0)
    if reorder >= cache:
        key = "reorder_window" if r.has("ntfy", "reorder_window") else "cache_duration"
        r.fail(
            "ntfy",
            key,
            f"ntfy.reorder_window ({format_duration(reorder)}) must be shorter than "
            f"ntfy.cache_duration ({format_duration(cache)})",
        )
    # The backfill must reach behind anything the reorder window let through, and behind ntfy's
    # delayed sender (it publishes a due scheduled message up to 10 s late).
    least_overlap = reorder + DELAYED_SENDER_PERIOD
    overlap = _duration(r, "ntfy", "overlap", max(30.0, least_overlap), 0.0)
    if overlap < least_overlap:
        r.fail(
            "ntfy",
            "overlap",
            f"must be at least ntfy.reorder_window + {format_duration(DELAYED_SENDER_PERIOD)}"
            f" ({format_duration(least_overlap)}), got {format_duration(overlap)}",
        )
    return NtfySettings(
        url=url.rstrip("/"),
        topics=topics,
        token=_token(r, "ntfy"),
        cache_duration=cache,
        keepalive_interval=interval,
        keepalive_timeout=timeout,
        dead_after=dead_after,
        reorder_window=reorder,
        first_start=_first_start(r),
        cache_settle=_duration(r, "ntfy", "cache_settle", 2.0, 0.0),
        overlap=overlap,
    )


def _duration(
    r: _Reader,
    section: str,
    key: str,
    default: float,
    minimum: float,
    *,
    strict: bool = False,
    bound_by: str = "",
) -> float:
    """A duration that must be >= minimum (> when strict; `bound_by` names the key the minimum
    comes from); `default` when unset."""
    seconds = r.duration(section, key)
    if seconds is None:
        return default
    if seconds < minimum or (strict and seconds == minimum):
        relation = "longer than" if strict else "at least"
        bound = format_duration(minimum) + (f" ({bound_by})" if bound_by else "")
        r.fail(section, key, f"must be {relation} {bound}, got {format_duration(seconds)}")
    return seconds


def _first_start(r: _Reader) -> FirstStart:
    text = r.text("ntfy", "first_start")
    if text is None or text == "now":
        return FirstStart("now")
    if text == "all":
        return FirstStart("all")
    try:
        seconds = parse_duration(text)
    except ValueError:
        shown = r.show("ntfy", "first_start", text)
        r.fail("ntfy", "first_start", f'expected "now", "all" or a duration like 6h, got {shown}')
    if seconds <= 0:
        r.fail("ntfy", "first_start", 'a history duration must be longer than 0s (or use "now")')
    return FirstStart("history", seconds)


def _state_dir(r: _Reader, environ: Mapping[str, str]) -> Path:
    text = r.text("state", "dir")
    if text is None:
        systemd = environ.get("STATE_DIRECTORY", "").split(":")[0]
        return Path(systemd) if systemd else DEFAULT_STATE_DIR
    base = r.base("state", "dir")
    return base / text if base is not None else Path(text)


def _relay(r: _Reader) -> RelaySettings:
    attempts = r.integer("relay", "max_attempts")
    if attempts is not None and attempts < 1:
        r.fail("relay", "max_attempts", f"must be at least 1, got {attempts}")
    secret = r.text("relay", "secret")
    if secret is not None:
        try:
            signing.parse_secret(secret)
        except signing.SecretError as exc:
            r.fail("relay", "secret", f"not a Standard Webhooks secret: {exc} (value not shown)")
    return RelaySettings(
        url=_url(r, "relay", "url", query=True),
        timeout=_duration(r, "relay", "timeout", 10.0, 0.0, strict=True),
        max_attempts=8 if attempts is None else attempts,
        secret=secret,
        token=_token(r, "relay"),
    )


def _cadence(r: _Reader) -> CadenceSettings:
    cap = r.integer("cadence", "daily_cap")
    if cap is not None and cap < 0:
        r.fail("cadence", "daily_cap", f"must be at least 0, got {cap}")
    timezone = r.text("cadence", "timezone") or "UTC"
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        shown = r.show("cadence", "timezone", timezone)
        hint = " (is the tz database installed?)" if timezone == "UTC" else ""
        r.fail(
            "cadence",
            "timezone",
            f"unknown time zone {shown}, expected a name like Europe/Berlin{hint}",
        )
    return CadenceSettings(
        debounce=_duration(r, "cadence", "debounce", 120.0, 0.0),
        cooldown=_duration(r, "cadence", "cooldown", 3600.0, 0.0),
        daily_cap=10 if cap is None else cap,
        timezone=timezone,
    )


def _owner(r: _Reader, ntfy: NtfySettings) -> OwnerSettings:
    signal_url = _url(r, "owner", "signal_url", query=False)
    if signal_url is not None:
        signal_url = signal_url.rstrip("/")
        if signal_url.endswith("/v2/send"):
            r.fail("owner", "signal_url", "give the base URL: the daemon appends /v2/send itself")
    number = r.text("owner", "signal_number")
    recipients = r.strings("owner", "recipients") or ()
    if number is not None and not PHONE_RE.fullmatch(number):
        r.fail("owner", "signal_number", f"expected a number like +4915112345678, got {number!r}")
    for recipient in recipients:
        if not (PHONE_RE.fullmatch(recipient) or GROUP_RE.fullmatch(recipient)):
            r.fail(
                "owner",
                "recipients",
                f"expected a number like +4915112345678 or a group id like group.<base64>, "
                f"got {r.show('owner', 'recipients', recipient)}",
            )
        if recipients.count(recipient) > 1:
            r.fail("owner", "recipients", f"{recipient!r} is listed twice")
    if signal_url is not None:
        if number is None:
            r.fail("owner", "signal_number", "required when owner.signal_url is set")
        if not recipients:
            r.fail(
                "owner",
                "recipients",
                "at least one recipient is required when owner.signal_url is set",
            )
    else:
        for key, value in (("signal_number", number), ("recipients", recipients)):
            if value:
                r.fail(
                    "owner", key, "is set but owner.signal_url is not (Signal would never be used)"
                )
    fallback = r.text("owner", "fallback_topic")
    if fallback is not None:
        _check_topic(r, "owner", "fallback_topic", fallback)
        if fallback in ntfy.topics:
            r.fail(
                "owner",
                "fallback_topic",
                f"{fallback!r} is also in ntfy.topics: the daemon would ingest its own notices",
            )
    return OwnerSettings(
        signal_url=signal_url, signal_number=number, recipients=recipients, fallback_topic=fallback
    )


def _http(r: _Reader) -> HttpSettings:
    listen = r.text("http", "listen") or "127.0.0.1:8788"
    try:
        split_listen(listen)
    except ValueError as exc:
        r.fail("http", "listen", f"{exc}, got {r.show('http', 'listen', listen)}")
    return HttpSettings(listen=listen, token=_token(r, "http"))


def _health(r: _Reader) -> HealthSettings:
    return HealthSettings(
        ping_url=_url(r, "health", "ping_url", query=True),
        ping_interval=_duration(r, "health", "ping_interval", 60.0, 1.0),
    )


def _token(r: _Reader, section: str) -> str | None:
    token = r.text(section, "token")
    if token is not None and not re.fullmatch(r"[\x21-\x7e]+", token):
        r.fail(section, "token", "must be printable ASCII without spaces (value not shown)")
    return token


def _url(r: _Reader, section: str, key: str, *, query: bool) -> str | None:
    url = r.text(section, key)
    if url is None:
        return None
    shown = r.show(section, key, url)
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a bad port
    except ValueError:
        r.fail(section, key, f"expected an http:// or https:// URL, got {shown}")
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
        r.fail(section, key, f"expected an http:// or https:// URL, got {shown}")
    if parts.fragment or (parts.query and not query):
        r.fail(
            section, key, f"must not have a {'query or ' if not query else ''}fragment, got {shown}"
        )
    return url


def _check_topic(r: _Reader, section: str, key: str, topic: str) -> None:
    if not TOPIC_RE.fullmatch(topic):
        r.fail(section, key, f"{topic!r} is not a topic name (1-64 of A-Z a-z 0-9 - _)")
    if topic in DISALLOWED_TOPICS:
        r.fail(section, key, f"{topic!r} is reserved by ntfy and cannot be a topic")


def _first_start_text(first_start: FirstStart) -> str:
    return (
        first_start.mode if first_start.mode != "history" else format_duration(first_start.seconds)
    )


def _mask_url(url: str) -> str:
    """Hide the credentials of `https://user:pass@host/` as `https://***@host/`."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc = rest[:end]
    if not sep or "@" not in netloc:
        return url
    return f"{scheme}://***@{netloc.rsplit('@', 1)[1]}{rest[end:]}"


def _suggest(word: str, candidates: Iterable[str]) -> str:
    match = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.75)
    return f" (did you mean {match[0]}?)" if match else ""


def _show_key(key: str) -> str:
    return key if re.fullmatch(r"[-A-Za-z0-9_]{1,80}", key) else repr(key[:80])


def _show_path(path: Path) -> str:
    text = str(path)
    return text if text.isprintable() else repr(text)


def _type_name(value: object) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
    }
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    if isinstance(value, dict):
        return "a table"
    return f"a TOML {type(value).__name__}"  # datetime, date, time


def secret_from(
    flag: str, path: Path | None, env: str, environ: Mapping[str, str], *, allow: bool = False
) -> str | None:
    """A secret for a helper command: from `path` (a `--...-file` flag), else `env`, else the
    file named by `env`_FILE; a secret file readable by group or others is refused unless
    `allow`. Never from argv itself."""
    if path is not None:
        label = flag
    elif environ.get(env):
        return environ[env].strip()
    elif environ.get(env + "_FILE"):
        path, label = Path(environ[env + "_FILE"]), f"{env}_FILE"
    else:
        return None
    value = _resolve_file(_Value(label, None, textual=True, file=path), check=not allow)
    assert isinstance(value.raw, str)
    return value.raw.strip()
