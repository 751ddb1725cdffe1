"""Where raw values come from: the TOML file, the environment twins (`NTFY_INTAKE_<SECTION>_<KEY>`),
and `*_file`/`*_FILE` indirections, with the refusal of secret files others can read (as ssh
refuses such a key)."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import stat
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ntfy_intake.errors import ConfigError
from ntfy_intake.settings.schema import (
    _SECTIONS,
    ALL_KEYS,
    CONFIG_ENV,
    ENV_PREFIX,
    MAX_FILE_BYTES,
    TEST_ENV_PREFIX,
    T,
    env_name,
)


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


@dataclass(frozen=True, slots=True)
class _Value:
    """One key's raw value and where it came from."""

    label: str  # "ntfy.url", or "ntfy.url (NTFY_INTAKE_NTFY_URL)", for error messages
    raw: object  # a TOML value, or the text of an environment variable or file
    textual: bool  # True when raw is text to parse (env, file), False for a typed TOML value
    trim: bool = False  # an env value: surrounding spaces are dropped (file content is exact)
    base: Path | None = None  # where a relative path in the TOML file is resolved from
    file: Path | None = None  # read raw from this file (a `_file` / `_FILE` indirection)


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
