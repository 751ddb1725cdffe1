"""The settings loader: every rule, table-driven, each starting from an empty environment mapping."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from ntfy_intake import settings
from ntfy_intake.errors import ConfigError
from ntfy_intake.settings import ALL_KEYS, FirstStart, Settings, env_name, load
from ntfy_intake.settings.schema import Dsn

ROOT = Path(__file__).resolve().parents[2]
URL = "https://ntfy.example.com"
BASE: dict[str, str] = {"NTFY_INTAKE_NTFY_URL": URL, "NTFY_INTAKE_NTFY_TOPICS": "alerts"}
MINIMAL_TOML = f'[ntfy]\nurl = "{URL}"\ntopics = ["alerts"]\n'
WEBHOOK_SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # 24 bytes of base64


@pytest.fixture(autouse=True)
def private_umask() -> Iterator[None]:
    """Files written here are 0600, as an operator's secret files should be; the permission
    tests chmod them open on purpose."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def env(**overrides: str) -> dict[str, str]:
    """BASE plus `NTFY_INTAKE_<NAME>` overrides: env(NTFY_TOKEN="x")."""
    return BASE | {f"NTFY_INTAKE_{name}": value for name, value in overrides.items()}


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_toml(tmp_path: Path, text: str, environ: Mapping[str, str] | None = None) -> Settings:
    return load(write(tmp_path, text), environ or {})


def error_of(call: object, key: str) -> str:
    """Run `call`, expect a ConfigError naming `key` first, and return its one-line message."""
    assert callable(call)
    with pytest.raises(ConfigError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"config error: {key}"), message
    assert info.value.key.split(" ")[0] == key
    assert "\n" not in message and "\r" not in message
    return message


# ----------------------------------------------------------------------------------------------------
# Shape, names, defaults


def test_all_keys_match_the_dataclasses() -> None:
    derived = [
        (section.name, key.name)
        for section in dataclasses.fields(Settings)
        if section.metadata.get("section", True)  # [[maintenance]]: entries, not keys
        for key in dataclasses.fields(getattr(settings, str(section.type)))
        if key.metadata.get("key", True)  # ClusterSettings.configured says where, not what
    ]
    assert list(ALL_KEYS) == derived


def test_env_name() -> None:
    assert env_name("ntfy", "url") == "NTFY_INTAKE_NTFY_URL"
    assert env_name("cadence", "daily_cap") == "NTFY_INTAKE_CADENCE_DAILY_CAP"


def test_defaults() -> None:
    s = load(None, BASE)
    assert s.ntfy.url == URL
    assert s.ntfy.topics == ("alerts",)
    assert s.ntfy.token is None
    assert s.ntfy.cache_duration == 12 * 3600
    assert s.ntfy.keepalive_interval == 45
    assert s.ntfy.keepalive_timeout == 112.5
    assert s.ntfy.dead_after == 300
    assert s.ntfy.reorder_window == 5
    assert s.ntfy.first_start == FirstStart("now")
    assert s.state.dir == Path("/var/lib/ntfy-intake")
    assert s.state.store == Path("/var/lib/ntfy-intake/intake.sqlite3")
    assert s.state.audit_dir == Path("/var/lib/ntfy-intake/audit")
    assert (s.relay.url, s.relay.timeout, s.relay.max_attempts) == (None, 10, 8)
    assert (s.cadence.debounce, s.cadence.cooldown, s.cadence.daily_cap) == (120, 3600, 10)
    assert s.cadence.timezone == "UTC"
    assert str(s.cadence.zone) == "UTC"
    assert s.owner == settings.OwnerSettings(None, None, (), None)
    assert (s.http.listen, s.http.host, s.http.port, s.http.token) == (
        "127.0.0.1:8788",
        "127.0.0.1",
        8788,
        None,
    )


def test_settings_are_frozen() -> None:
    s = load(None, BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.ntfy.url = "http://other"  # type: ignore[misc]


# ----------------------------------------------------------------------------------------------------
# Sources and precedence


def test_env_beats_toml_beats_default(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_TOML + 'reorder_window = "7s"\ndead_after = "10m"\n')
    s = load(path, {"NTFY_INTAKE_NTFY_DEAD_AFTER": "20m"})
    assert s.ntfy.dead_after == 1200  # env
    assert s.ntfy.reorder_window == 7  # TOML
    assert s.ntfy.cache_duration == 43200  # default


def test_config_env_names_the_file_when_no_path_is_given(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_TOML)
    assert load(None, {"NTFY_INTAKE_CONFIG": str(path)}).ntfy.topics == ("alerts",)


def test_an_explicit_path_beats_the_config_env(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_TOML)
    assert load(path, {"NTFY_INTAKE_CONFIG": str(tmp_path / "missing.toml")}).ntfy.url == URL


def test_no_file_at_all_means_defaults_and_env() -> None:
    assert load(None, BASE).ntfy.url == URL


def test_an_empty_env_var_counts_as_unset(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_TOML + 'reorder_window = "7s"\n')
    s = load(path, {"NTFY_INTAKE_NTFY_REORDER_WINDOW": "", "NTFY_INTAKE_CONFIG": ""})
    assert s.ntfy.reorder_window == 7


def test_env_values_are_trimmed_and_lists_split_on_commas() -> None:
    s = load(None, env(NTFY_TOPICS=" alerts , backups ", CADENCE_TIMEZONE=" Europe/Berlin "))
    assert s.ntfy.topics == ("alerts", "backups")
    assert s.cadence.timezone == "Europe/Berlin"


def test_every_key_has_a_working_env_twin(tmp_path: Path) -> None:
    """Set every key through its twin at once and see each one land."""
    recipients = "+4915112345678,group.YWJjZA=="
    values = {
        ("ntfy", "url"): "http://ntfy.local:8080/",
        ("ntfy", "topics"): "a,b",
        ("ntfy", "token"): "tk_secret",
        ("ntfy", "cache_duration"): "24h",
        ("ntfy", "keepalive_interval"): "30s",
        ("ntfy", "keepalive_timeout"): "1m",
        ("ntfy", "dead_after"): "10m",
        ("ntfy", "reorder_window"): "2s",
        ("ntfy", "first_start"): "6h",
        ("ntfy", "cache_settle"): "3s",
        ("ntfy", "overlap"): "45s",
        ("ntfy", "profiles"): "off",
        ("state", "dir"): str(tmp_path),
        ("state", "database"): "postgresql://intake@db.lan:5433/alerts",
        ("cluster", "node"): "pi-b",
        ("cluster", "lease_ttl"): "12s",
        ("cluster", "renew_every"): "3s",
        ("cluster", "url"): "http://pi-b.lan:8080",
        ("cluster", "probe_every"): "20s",
        ("cluster", "yield_after"): "2m",
        ("cluster", "yield_cooloff"): "10m",
        ("relay", "url"): "http://127.0.0.1:9000/triage",
        ("relay", "timeout"): "3s",
        ("relay", "max_attempts"): "3",
        ("relay", "concurrency"): "2",
        ("relay", "escalate_after"): "5m",
        ("relay", "escalate_min_severity"): "5",
        ("relay", "escalate_daily_cap"): "3",
        ("relay", "escalate_handle"): "triager",
        ("relay", "secret"): WEBHOOK_SECRET,
        ("relay", "token"): "rx-token",
        ("cadence", "debounce"): "30s",
        ("cadence", "cooldown"): "2h",
        ("cadence", "daily_cap"): "0",
        ("cadence", "timezone"): "Europe/Berlin",
        ("owner", "signal_url"): "http://127.0.0.1:8080",
        ("owner", "signal_number"): "+4915100000000",
        ("owner", "recipients"): recipients,
        ("owner", "fallback_topic"): "owner-fallback",
        ("owner", "receive"): "poll",
        ("owner", "receive_every"): "10s",
        ("owner", "reply_from"): "+4915100000001",
        ("owner", "receive_dead_after"): "15m",
        ("http", "listen"): "[::1]:9999",
        ("http", "token"): "feed-token-7Hq2Xv9Lp4",
        ("http", "public_url"): "https://intake.home.lan",
        ("health", "ping_url"): "https://hc-ping.example/abc-123",
        ("health", "ping_interval"): "2m",
    }
    assert set(values) == set(ALL_KEYS)
    s = load(None, {env_name(*key): value for key, value in values.items()})
    assert s == Settings(
        ntfy=settings.NtfySettings(
            url="http://ntfy.local:8080",
            topics=("a", "b"),
            token="tk_secret",
            cache_duration=86400,
            keepalive_interval=30,
            keepalive_timeout=60,
            dead_after=600,
            reorder_window=2,
            first_start=FirstStart("history", 6 * 3600),
            cache_settle=3,
            overlap=45,
            profiles="off",
        ),
        state=settings.StateSettings(
            tmp_path, database=Dsn("postgresql://intake@db.lan:5433/alerts")
        ),
        cluster=settings.ClusterSettings(
            "pi-b",
            12,
            3,
            "http://pi-b.lan:8080",
            probe_every=20,
            yield_after=120,
            yield_cooloff=600,
            configured=True,
        ),
        relay=settings.RelaySettings(
            "http://127.0.0.1:9000/triage",
            3,
            3,
            WEBHOOK_SECRET,
            "rx-token",
            concurrency=2,
            escalate_after=300,
            escalate_min_severity=5,
            escalate_daily_cap=3,
            escalate_handle="triager",
        ),
        cadence=settings.CadenceSettings(30, 7200, 0, "Europe/Berlin"),
        owner=settings.OwnerSettings(
            "http://127.0.0.1:8080",
            "+4915100000000",
            ("+4915112345678", "group.YWJjZA=="),
            "owner-fallback",
            receive="poll",
            receive_every=10.0,
            reply_from=("+4915100000001",),
            receive_dead_after=900.0,
        ),
        http=settings.HttpSettings(
            "[::1]:9999", "feed-token-7Hq2Xv9Lp4", public_url="https://intake.home.lan"
        ),
        health=settings.HealthSettings("https://hc-ping.example/abc-123", 120),
    )
    assert (s.http.host, s.http.port) == ("::1", 9999)


# ----------------------------------------------------------------------------------------------------
# _FILE and _file indirection


def test_env_file_is_read_and_one_trailing_newline_stripped(tmp_path: Path) -> None:
    secret = write(tmp_path, "tk_abc\n", "token")
    assert load(None, env(NTFY_TOKEN_FILE=str(secret))).ntfy.token == "tk_abc"


def test_crlf_counts_as_one_trailing_newline(tmp_path: Path) -> None:
    secret = write(tmp_path, "tk_abc7Hq2Xv9Lp4Ws3Rm8\r\n", "token")
    assert load(None, env(HTTP_TOKEN_FILE=str(secret))).http.token == "tk_abc7Hq2Xv9Lp4Ws3Rm8"


def test_only_one_trailing_newline_is_stripped(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_bytes(b"tk_abc\n\n")
    message = error_of(lambda: load(None, env(NTFY_TOKEN_FILE=str(secret))), "ntfy.token")
    assert "tk_abc" not in message


def test_toml_file_key_is_resolved_from_the_config_directory(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    write(tmp_path, "tk_abc\n", "secrets/ntfy")
    s = load_toml(tmp_path, MINIMAL_TOML + 'token_file = "secrets/ntfy"\n')
    assert s.ntfy.token == "tk_abc"


def test_any_key_may_come_from_a_file(tmp_path: Path) -> None:
    topics = write(tmp_path, "alerts\nbackups\n", "topics")
    cap = write(tmp_path, "3\n", "cap")
    debounce = write(tmp_path, "10s", "debounce")
    s = load(
        None,
        {
            "NTFY_INTAKE_NTFY_URL": URL,
            "NTFY_INTAKE_NTFY_TOPICS_FILE": str(topics),
            "NTFY_INTAKE_CADENCE_DAILY_CAP_FILE": str(cap),
            "NTFY_INTAKE_CADENCE_DEBOUNCE_FILE": str(debounce),
        },
    )
    assert (s.ntfy.topics, s.cadence.daily_cap, s.cadence.debounce) == (
        ("alerts", "backups"),
        3,
        10,
    )


def test_env_beats_a_toml_file_key_without_reading_it(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_TOML + 'token_file = "does-not-exist"\n')
    assert load(path, {"NTFY_INTAKE_NTFY_TOKEN": "tk_env"}).ntfy.token == "tk_env"


@pytest.mark.parametrize(
    ("toml", "environ", "key", "fragment"),
    [
        (
            "",
            env(NTFY_TOKEN="a", NTFY_TOKEN_FILE="/x"),
            "ntfy.token",
            "NTFY_INTAKE_NTFY_TOKEN_FILE",
        ),
        ('token = "a"\ntoken_file = "/x"\n', {}, "ntfy.token", "token_file"),
        ("", env(NTFY_TOKEN_FILE="/nonexistent/tok"), "ntfy.token", "/nonexistent/tok"),
        ('token_file = "missing"\n', {}, "ntfy.token", "missing"),
        ("token_file = 3\n", {}, "ntfy.token_file", "file path"),
        ('token_file = ""\n', {}, "ntfy.token_file", "file path"),
    ],
)
def test_file_indirection_errors(
    tmp_path: Path, toml: str, environ: dict[str, str], key: str, fragment: str
) -> None:
    path = write(tmp_path, MINIMAL_TOML + toml)
    message = error_of(lambda: load(path, environ), key)
    assert fragment in message


def test_an_unreadable_file_names_the_key_the_variable_and_the_path(tmp_path: Path) -> None:
    message = error_of(lambda: load(None, env(HTTP_TOKEN_FILE=str(tmp_path))), "http.token")
    assert "NTFY_INTAKE_HTTP_TOKEN_FILE" in message
    assert str(tmp_path) in message


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b"", "is empty"), (b"\n", "is empty"), (b"\xff\xfe", "UTF-8"), (b"x" * 70_000, "KiB")],
)
def test_bad_file_contents(tmp_path: Path, content: bytes, fragment: str) -> None:
    secret = tmp_path / "token"
    secret.write_bytes(content)
    message = error_of(lambda: load(None, env(NTFY_TOKEN_FILE=str(secret))), "ntfy.token")
    assert fragment in message


# ----------------------------------------------------------------------------------------------------
# The config file itself


def test_missing_config_file(tmp_path: Path) -> None:
    message = error_of(lambda: load(tmp_path / "nope.toml", {}), "config")
    assert "nope.toml" in message


def test_missing_config_file_from_env_names_the_variable(tmp_path: Path) -> None:
    environ = {"NTFY_INTAKE_CONFIG": str(tmp_path / "nope.toml")}
    message = error_of(lambda: load(None, environ), "config")
    assert "NTFY_INTAKE_CONFIG" in message


def test_toml_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    message = error_of(lambda: load_toml(tmp_path, '[ntfy]\nurl = \ntopics = ["a"]\n'), "config")
    assert re.search(r"line \d+, column \d+", message), message
    assert "config.toml" in message


def test_config_file_must_be_utf8(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b'[ntfy]\nurl = "\xff"\n')
    assert "UTF-8" in error_of(lambda: load(path, {}), "config")


@pytest.mark.parametrize(
    ("toml", "key", "fragment"),
    [
        ("[ntfyy]\nurl = 1\n", "ntfyy", "unknown section (did you mean ntfy?)"),
        ("[ntfy]\ntopic = []\n", "ntfy.topic", "unknown key (did you mean topics?)"),
        ("[cadence]\ndaily_limit = 3\n", "cadence.daily_limit", "unknown key"),
        ("[ntfy.extra]\nx = 1\n", "ntfy.extra", "unknown key"),
        ('url = "x"\n', "url", "unknown top-level key"),
        ('ntfy = "x"\n', "ntfy", "expected a table"),
        ('[ntfy]\n"a.b\\n" = 1\n', "ntfy.'a.b\\n'", "unknown key"),
    ],
)
def test_unknown_sections_and_keys(tmp_path: Path, toml: str, key: str, fragment: str) -> None:
    assert fragment in error_of(lambda: load_toml(tmp_path, toml, BASE), key)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("NTFY_INTAKE_NTFY_TOPIC", "did you mean NTFY_INTAKE_NTFY_TOPICS?"),
        ("NTFY_INTAKE_URL", "unknown environment variable"),
        ("NTFY_INTAKE_CONFIG_FILE", "unknown environment variable"),
        ("NTFY_INTAKE_", "unknown environment variable"),
    ],
)
def test_unknown_env_vars(name: str, fragment: str) -> None:
    assert fragment in error_of(lambda: load(None, BASE | {name: "x"}), name)


def test_reserved_and_foreign_env_vars_are_ignored() -> None:
    environ = BASE | {
        "NTFY_INTAKE_TEST_FAULT": "before_commit",
        "ntfy_intake_ntfy_url": "lower case is not ours",
        "NTFY_URL": "not ours either",
        "HOME": "/root",
    }
    assert load(None, environ).ntfy.url == URL


# ----------------------------------------------------------------------------------------------------
# Types in TOML


@pytest.mark.parametrize(
    ("toml", "key", "fragment"),
    [
        ("[ntfy]\nurl = 1\ntopics = ['a']\n", "ntfy.url", "expected a string, got an integer"),
        ("[ntfy]\nurl = 'http://x'\ntopics = 'alerts'\n", "ntfy.topics", 'like ["a", "b"]'),
        ("[ntfy]\nurl = 'http://x'\ntopics = ['a', 2]\n", "ntfy.topics", "item 1"),
        ("[ntfy]\nurl = 'http://x'\ntopics = [['a']]\n", "ntfy.topics", "got an array"),
        (MINIMAL_TOML + "cache_duration = 45\n", "ntfy.cache_duration", "use a duration like 45s"),
        (MINIMAL_TOML + "dead_after = 1.5\n", "ntfy.dead_after", "use a duration like 1.5s"),
        (MINIMAL_TOML + "dead_after = true\n", "ntfy.dead_after", "got a boolean"),
        (MINIMAL_TOML + "dead_after = ['5m']\n", "ntfy.dead_after", "got an array"),
        (MINIMAL_TOML + "first_start = 6\n", "ntfy.first_start", "use a duration like 6s"),
        (MINIMAL_TOML + "first_start = true\n", "ntfy.first_start", "got a boolean"),
        (MINIMAL_TOML + "token = ''\n", "ntfy.token", "must not be empty"),
        (MINIMAL_TOML + "[relay]\nmax_attempts = true\n", "relay.max_attempts", "got a boolean"),
        (MINIMAL_TOML + "[relay]\nmax_attempts = 3.0\n", "relay.max_attempts", "got a float"),
        (MINIMAL_TOML + "[relay]\nmax_attempts = '3'\n", "relay.max_attempts", "got a string"),
        (MINIMAL_TOML + "[cadence]\ndaily_cap = 1979-05-27\n", "cadence.daily_cap", "TOML date"),
        (MINIMAL_TOML + "[cadence]\ntimezone = {}\n", "cadence.timezone", "got a table"),
        (MINIMAL_TOML + "[owner]\nrecipients = '+49151'\n", "owner.recipients", "list"),
        (MINIMAL_TOML + "[http]\nlisten = 8788\n", "http.listen", "got an integer"),
        (MINIMAL_TOML + "[state]\ndir = ''\n", "state.dir", "must not be empty"),
        (MINIMAL_TOML + '[state]\ndir = "a\\u0000b"\n', "state.dir", "control characters"),
    ],
)
def test_toml_types_are_checked_exactly(tmp_path: Path, toml: str, key: str, fragment: str) -> None:
    assert fragment in error_of(lambda: load_toml(tmp_path, toml), key)


# ----------------------------------------------------------------------------------------------------
# Values: each rule, through the environment (the message names the variable)


@pytest.mark.parametrize(
    ("name", "value", "key", "fragment"),
    [
        # ntfy.url
        ("NTFY_URL", "ntfy.example.com", "ntfy.url", "http:// or https://"),
        ("NTFY_URL", "ftp://ntfy.example.com", "ntfy.url", "http:// or https://"),
        ("NTFY_URL", "https://", "ntfy.url", "http:// or https://"),
        ("NTFY_URL", "https://ntfy:99999", "ntfy.url", "http:// or https://"),
        ("NTFY_URL", "https://nt fy", "ntfy.url", "http:// or https://"),
        ("NTFY_URL", "https://ntfy/?x=1", "ntfy.url", "query"),
        ("NTFY_URL", "https://ntfy/#x", "ntfy.url", "fragment"),
        ("NTFY_URL", "https://ntfy\x07", "ntfy.url", "control characters"),
        # ntfy.topics
        ("NTFY_TOPICS", "alerts,,backups", "ntfy.topics", "empty item"),
        ("NTFY_TOPICS", "alerts,", "ntfy.topics", "empty item"),
        ("NTFY_TOPICS", "   ", "ntfy.topics", "at least one topic"),
        ("NTFY_TOPICS", "alerts,alerts", "ntfy.topics", "listed twice"),
        ("NTFY_TOPICS", "bad topic", "ntfy.topics", "not a topic name"),
        ("NTFY_TOPICS", "a/b", "ntfy.topics", "not a topic name"),
        ("NTFY_TOPICS", "x" * 65, "ntfy.topics", "not a topic name"),
        ("NTFY_TOPICS", "alerts,v1", "ntfy.topics", "reserved by ntfy"),
        ("NTFY_TOPICS", "docs", "ntfy.topics", "reserved by ntfy"),
        # durations and their bounds
        ("NTFY_KEEPALIVE_TIMEOUT", "soon", "ntfy.keepalive_timeout", "got 'soon'"),
        ("NTFY_CACHE_DURATION", "0s", "ntfy.cache_duration", "longer than 0s"),
        ("NTFY_CACHE_DURATION", "12", "ntfy.cache_duration", "needs a unit"),
        ("NTFY_KEEPALIVE_INTERVAL", "500ms", "ntfy.keepalive_interval", "at least 1s"),
        ("NTFY_KEEPALIVE_TIMEOUT", "45s", "ntfy.keepalive_timeout", "ntfy.keepalive_interval"),
        ("NTFY_DEAD_AFTER", "1m", "ntfy.dead_after", "ntfy.keepalive_timeout"),
        ("NTFY_REORDER_WINDOW", "12h", "ntfy.reorder_window", "shorter than ntfy.cache_duration"),
        ("NTFY_CACHE_DURATION", "5s", "ntfy.cache_duration", "shorter than ntfy.cache_duration"),
        ("NTFY_FIRST_START", "later", "ntfy.first_start", '"now", "all" or a duration'),
        ("NTFY_FIRST_START", "0s", "ntfy.first_start", "longer than 0s"),
        ("NTFY_FIRST_START", "NOW", "ntfy.first_start", '"now", "all" or a duration'),
        ("RELAY_TIMEOUT", "0s", "relay.timeout", "longer than 0s"),
        ("CADENCE_DEBOUNCE", "-1s", "cadence.debounce", "expected a duration"),
        # integers
        ("RELAY_MAX_ATTEMPTS", "0", "relay.max_attempts", "at least 1"),
        ("RELAY_MAX_ATTEMPTS", "three", "relay.max_attempts", "expected an integer"),
        ("RELAY_MAX_ATTEMPTS", "1.5", "relay.max_attempts", "expected an integer"),
        ("RELAY_MAX_ATTEMPTS", "9999999999", "relay.max_attempts", "at most"),
        ("CADENCE_DAILY_CAP", "-1", "cadence.daily_cap", "at least 0"),
        ("CADENCE_DAILY_CAP", "true", "cadence.daily_cap", "expected an integer"),
        # strings with a shape
        ("CADENCE_TIMEZONE", "Mars/Olympus", "cadence.timezone", "unknown time zone"),
        ("CADENCE_TIMEZONE", "../etc/passwd", "cadence.timezone", "unknown time zone"),
        ("CADENCE_TIMEZONE", "utc", "cadence.timezone", "unknown time zone"),
        ("RELAY_URL", "localhost:9000", "relay.url", "http:// or https://"),
        ("RELAY_URL", "http://r/#frag", "relay.url", "fragment"),
        ("HTTP_LISTEN", "8788", "http.listen", "host:port"),
        ("HTTP_LISTEN", "127.0.0.1", "http.listen", "host:port"),
        ("HTTP_LISTEN", "127.0.0.1:70000", "http.listen", "host:port"),
        ("HTTP_LISTEN", "::1:8788", "http.listen", "brackets"),
        ("HTTP_LISTEN", "[nope]:8788", "http.listen", "IPv6"),
        ("HTTP_LISTEN", ":8788", "http.listen", "host is missing"),
        ("HTTP_LISTEN", "bad_host:8788", "http.listen", "host name"),
    ],
)
def test_bad_values_from_env(name: str, value: str, key: str, fragment: str) -> None:
    message = error_of(lambda: load(None, env(**{name: value})), key)
    assert fragment in message
    assert f"(NTFY_INTAKE_{name})" in message


def test_the_brief_example_message_verbatim() -> None:
    with pytest.raises(ConfigError) as info:
        load(None, env(NTFY_KEEPALIVE_TIMEOUT="soon"))
    assert str(info.value) == (
        "config error: ntfy.keepalive_timeout (NTFY_INTAKE_NTFY_KEEPALIVE_TIMEOUT): "
        "expected a duration like 45s, got 'soon'"
    )


@pytest.mark.parametrize(
    ("environ", "key"),
    [({}, "ntfy.url"), ({"NTFY_INTAKE_NTFY_URL": URL}, "ntfy.topics")],
)
def test_required_keys(environ: dict[str, str], key: str) -> None:
    assert "required" in error_of(lambda: load(None, environ), key)


def test_required_in_toml_too(tmp_path: Path) -> None:
    error_of(lambda: load_toml(tmp_path, "[ntfy]\ntopics = ['a']\n"), "ntfy.url")


def test_an_empty_topic_list_in_toml(tmp_path: Path) -> None:
    toml = f'[ntfy]\nurl = "{URL}"\ntopics = []\n'
    assert "at least one topic" in error_of(lambda: load_toml(tmp_path, toml), "ntfy.topics")


# ----------------------------------------------------------------------------------------------------
# ntfy specifics


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("https://ntfy.sh/", "https://ntfy.sh"),
        ("https://ntfy.sh//", "https://ntfy.sh"),
        ("http://10.0.0.5:8080/ntfy/", "http://10.0.0.5:8080/ntfy"),
        ("https://[::1]:2586", "https://[::1]:2586"),
    ],
)
def test_ntfy_url_keeps_no_trailing_slash(url: str, kept: str) -> None:
    assert load(None, env(NTFY_URL=url)).ntfy.url == kept


def test_keepalive_timeout_default_follows_the_effective_interval() -> None:
    s = load(None, env(NTFY_KEEPALIVE_INTERVAL="10s"))
    assert (s.ntfy.keepalive_timeout, s.ntfy.dead_after) == (25, 300)


def test_keepalive_interval_of_one_second_is_fine() -> None:
    assert load(None, env(NTFY_KEEPALIVE_INTERVAL="1s")).ntfy.keepalive_timeout == 2.5


def test_unset_dead_after_follows_a_long_keepalive_timeout() -> None:
    s = load(None, env(NTFY_KEEPALIVE_INTERVAL="3m"))
    assert s.ntfy.keepalive_timeout == 450
    assert s.ntfy.dead_after == 450


def test_dead_after_equal_to_the_timeout_is_allowed() -> None:
    s = load(None, env(NTFY_KEEPALIVE_TIMEOUT="2m", NTFY_DEAD_AFTER="2m"))
    assert s.ntfy.dead_after == 120


def test_reorder_window_may_be_zero() -> None:
    assert load(None, env(NTFY_REORDER_WINDOW="0s")).ntfy.reorder_window == 0


@pytest.mark.parametrize(
    ("value", "first_start"),
    [
        ("now", FirstStart("now")),
        ("all", FirstStart("all")),
        ("6h", FirstStart("history", 21600)),
        ("90m", FirstStart("history", 5400)),
    ],
)
def test_first_start(value: str, first_start: FirstStart) -> None:
    assert load(None, env(NTFY_FIRST_START=value)).ntfy.first_start == first_start


# ----------------------------------------------------------------------------------------------------
# state, cadence, owner, http


@pytest.mark.parametrize(
    ("state_directory", "expected"),
    [
        ("/var/lib/ntfy-intake-unit", "/var/lib/ntfy-intake-unit"),
        ("/var/lib/first:/var/lib/second", "/var/lib/first"),
        ("", "/var/lib/ntfy-intake"),
    ],
)
def test_state_dir_from_systemd(state_directory: str, expected: str) -> None:
    s = load(None, BASE | {"STATE_DIRECTORY": state_directory})
    assert s.state.dir == Path(expected)


def test_configured_state_dir_beats_systemd(tmp_path: Path) -> None:
    environ = BASE | {"STATE_DIRECTORY": "/var/lib/x", "NTFY_INTAKE_STATE_DIR": str(tmp_path)}
    assert load(None, environ).state.dir == tmp_path


def test_relative_state_dir_in_toml_is_relative_to_the_config_file(tmp_path: Path) -> None:
    s = load_toml(tmp_path, MINIMAL_TOML + '[state]\ndir = "state"\n')
    assert s.state.dir == tmp_path / "state"
    assert s.state.store == tmp_path / "state" / "intake.sqlite3"


def test_relative_state_dir_from_env_stays_relative() -> None:
    assert load(None, env(STATE_DIR="data")).state.dir == Path("data")


def test_timezone_zone_property() -> None:
    s = load(None, env(CADENCE_TIMEZONE="Europe/Berlin"))
    assert s.cadence.zone.key == "Europe/Berlin"


SIGNAL = {
    "NTFY_INTAKE_OWNER_SIGNAL_URL": "http://signal:8080/",
    "NTFY_INTAKE_OWNER_SIGNAL_NUMBER": "+4915100000000",
    "NTFY_INTAKE_OWNER_RECIPIENTS": "+4915111111111",
}


def test_signal_owner_settings() -> None:
    s = load(None, BASE | SIGNAL)
    assert s.owner.signal_url == "http://signal:8080"
    assert s.owner.recipients == ("+4915111111111",)


@pytest.mark.parametrize(
    ("change", "key", "fragment"),
    [
        ({"NTFY_INTAKE_OWNER_SIGNAL_NUMBER": ""}, "owner.signal_number", "required when"),
        ({"NTFY_INTAKE_OWNER_RECIPIENTS": ""}, "owner.recipients", "at least one recipient"),
        ({"NTFY_INTAKE_OWNER_SIGNAL_NUMBER": "004915100"}, "owner.signal_number", "like +49"),
        ({"NTFY_INTAKE_OWNER_SIGNAL_NUMBER": "+49 151"}, "owner.signal_number", "like +49"),
        ({"NTFY_INTAKE_OWNER_RECIPIENTS": "+49151,bob"}, "owner.recipients", "group id"),
        ({"NTFY_INTAKE_OWNER_RECIPIENTS": "group.!!"}, "owner.recipients", "group id"),
        ({"NTFY_INTAKE_OWNER_RECIPIENTS": "+49151,+49151"}, "owner.recipients", "listed twice"),
        ({"NTFY_INTAKE_OWNER_SIGNAL_URL": "signal:8080"}, "owner.signal_url", "http://"),
        ({"NTFY_INTAKE_OWNER_SIGNAL_URL": "http://s/v2/send"}, "owner.signal_url", "base URL"),
        (
            {"NTFY_INTAKE_OWNER_SIGNAL_URL": "", "NTFY_INTAKE_OWNER_RECIPIENTS": ""},
            "owner.signal_number",
            "owner.signal_url is not",
        ),
        ({"NTFY_INTAKE_OWNER_FALLBACK_TOPIC": "a b"}, "owner.fallback_topic", "not a topic"),
        ({"NTFY_INTAKE_OWNER_FALLBACK_TOPIC": "app"}, "owner.fallback_topic", "reserved"),
        ({"NTFY_INTAKE_OWNER_FALLBACK_TOPIC": "alerts"}, "owner.fallback_topic", "ingest"),
    ],
)
def test_owner_rules(change: dict[str, str], key: str, fragment: str) -> None:
    environ = {name: value for name, value in (BASE | SIGNAL | change).items() if value}
    assert fragment in error_of(lambda: load(None, environ), key)


def test_recipients_without_signal_are_refused() -> None:
    environ = env(OWNER_RECIPIENTS="+4915111111111")
    error_of(lambda: load(None, environ), "owner.recipients")


def test_group_recipients_are_accepted() -> None:
    group = "group.dGVzdGdyb3VwaWQxMjM0NTY3ODkwYWJjZGVmZ2hpams="
    environ = BASE | SIGNAL | {"NTFY_INTAKE_OWNER_RECIPIENTS": f"{group},+4915111111111"}
    assert load(None, environ).owner.recipients == (group, "+4915111111111")


def test_fallback_topic_alone_is_fine() -> None:
    assert load(None, env(OWNER_FALLBACK_TOPIC="owner")).owner.fallback_topic == "owner"


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("127.0.0.1:8788", "127.0.0.1", 8788),
        ("[::1]:8788", "::1", 8788),
        ("localhost:1", "localhost", 1),
        ("0.0.0.0:0", "0.0.0.0", 0),
        ("intake.lan:65535", "intake.lan", 65535),
    ],
)
def test_http_listen(listen: str, host: str, port: int) -> None:
    s = load(None, env(HTTP_LISTEN=listen))
    assert (s.http.listen, s.http.host, s.http.port) == (listen, host, port)


# ----------------------------------------------------------------------------------------------------
# Secrets


SECRET = "tk_do-not-leak-0123456789"


@pytest.mark.parametrize("section", ["ntfy", "http"])
@pytest.mark.parametrize(
    "bad", [SECRET + " with space", SECRET + "\x1b[31m", SECRET + "ü", SECRET + "\ttab"]
)
def test_a_bad_secret_is_never_echoed(section: str, bad: str) -> None:
    message = error_of(
        lambda: load(None, BASE | {env_name(section, "token"): bad}), f"{section}.token"
    )
    assert SECRET not in message
    assert "value not shown" in message


def test_a_bad_secret_from_a_file_is_never_echoed(tmp_path: Path) -> None:
    secret = write(tmp_path, SECRET + "\nsecond line\n", "token")
    message = error_of(lambda: load(None, env(NTFY_TOKEN_FILE=str(secret))), "ntfy.token")
    assert SECRET not in message and "second line" not in message


def test_a_secret_of_the_wrong_toml_type_is_not_echoed(tmp_path: Path) -> None:
    message = error_of(
        lambda: load_toml(tmp_path, MINIMAL_TOML + "token = 123456789\n"), "ntfy.token"
    )
    assert "123456789" not in message


def test_redacted_hides_secrets_and_is_json() -> None:
    s = load(
        None,
        env(
            NTFY_URL="https://user:hunter2@ntfy.example.com/x",
            NTFY_TOKEN=SECRET,
            HTTP_TOKEN=SECRET + "-http",
            RELAY_URL="http://agent:pw@127.0.0.1:9000/hook?q=1",
        ),
    )
    out = s.redacted()
    text = json.dumps(out)
    assert SECRET not in text and "hunter2" not in text and "pw@" not in text
    assert out["ntfy"] == out["ntfy"] | {"token": "***", "url": "https://***@ntfy.example.com/x"}
    assert out["http"] == {"listen": "127.0.0.1:8788", "token": "***", "public_url": None}
    relay = out["relay"]
    assert isinstance(relay, dict) and relay["url"] == "http://***@127.0.0.1:9000/hook?q=1"
    assert {(section, key) for section, keys in out.items() for key in keys} == set(ALL_KEYS)  # type: ignore[attr-defined]


def test_redacted_shows_none_for_unset_secrets() -> None:
    out = load(None, BASE).redacted()
    assert out["ntfy"]["token"] is None  # type: ignore[index]
    assert out["http"]["token"] is None  # type: ignore[index]


def test_repr_never_shows_secrets() -> None:
    s = load(None, env(NTFY_TOKEN=SECRET, HTTP_TOKEN=SECRET))
    assert SECRET not in repr(s)
    assert SECRET not in str(s)


def test_redacted_values_load_back_to_the_same_settings(tmp_path: Path) -> None:
    """redacted() shows effective values in config syntax: feeding them back changes nothing."""
    original = load(None, BASE | SIGNAL | {env_name("state", "dir"): str(tmp_path)})
    environ: dict[str, str] = {}
    for section, values in original.redacted().items():
        assert isinstance(values, dict)
        for key, value in values.items():
            if value is not None:
                text = ",".join(value) if isinstance(value, list) else str(value)
                environ[env_name(section, key)] = text
    assert load(None, environ) == original


# ----------------------------------------------------------------------------------------------------
# Documentation and the sample config


def test_every_key_is_documented_with_its_env_twin() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    missing = []
    for section, key in ALL_KEYS:
        twin = env_name(section, key)
        rows = [line for line in doc.splitlines() if twin in line]
        if not any(f"`{key}`" in row for row in rows):
            missing.append(f"{section}.{key} ({twin})")
    assert not missing, f"docs/configuration.md lacks a row for: {missing}"


def test_every_key_is_in_the_sample_config() -> None:
    sample = (ROOT / "deploy" / "config.example.toml").read_text()
    present: set[tuple[str, str]] = set()
    section = ""
    for line in sample.splitlines():
        if header := re.fullmatch(r"\[(\w+)\]\s*", line):
            section = header.group(1)
        elif assignment := re.match(r"#?\s?(\w+)\s*=", line):
            present.add((section, assignment.group(1).removesuffix("_file")))
    assert set(ALL_KEYS) <= present, sorted(set(ALL_KEYS) - present)


def test_the_sample_config_loads(tmp_path: Path) -> None:
    s = load(ROOT / "deploy" / "config.example.toml", {env_name("state", "dir"): str(tmp_path)})
    assert s.state.dir == tmp_path
    assert s.ntfy.topics


def test_the_sample_config_with_every_commented_key_enabled_loads(tmp_path: Path) -> None:
    """Uncomment every `# key = value` line: the examples in the comments must be valid too."""
    sample = (ROOT / "deploy" / "config.example.toml").read_text()
    lines = []
    for line in sample.splitlines():
        match = re.match(r"#\s?(\w+\s*=.*)", line)
        if match and not match.group(1).split("=")[0].strip().endswith("_file"):
            lines.append(match.group(1))
        else:
            lines.append(line)
    path = write(tmp_path, "\n".join(lines) + "\n")
    s = load(path, {env_name("state", "dir"): str(tmp_path)})
    assert s.ntfy.token is not None and s.owner.signal_url is not None


def test_an_empty_recipient_list_without_signal_is_fine(tmp_path: Path) -> None:
    assert load_toml(tmp_path, MINIMAL_TOML + "[owner]\nrecipients = []\n").owner.recipients == ()


# ----------------------------------------------------------------------------------------------------
# Secrets in files others can read (refused, as ssh refuses such a key) and the webhook secret


def test_config_with_an_inline_secret_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_TOML + 'token = "tk_inline"\n')
    path.chmod(0o644)
    message = error_of(lambda: load(path, {}), "config")
    assert "holds ntfy.token" in message and "mode 0644" in message
    assert "--allow-insecure-permissions" in message and "tk_inline" not in message
    assert load(path, {}, allow_insecure_permissions=True).ntfy.token == "tk_inline"
    path.chmod(0o600)
    assert load(path, {}).ntfy.token == "tk_inline"


def test_config_without_a_secret_may_be_world_readable(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL_TOML + 'token_file = "token"\n')
    write(tmp_path, "tk_from_file\n", "token")
    path.chmod(0o644)
    assert load(path, {}).ntfy.token == "tk_from_file"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_secret_file_readable_by_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    secret = write(tmp_path, "tk_secret_in_file_7Hq2X\n", "token")
    secret.chmod(mode)
    message = error_of(lambda: load(None, env(HTTP_TOKEN_FILE=str(secret))), "http.token")
    assert "readable by group or others" in message and "tk_secret_in_file_7Hq2X" not in message
    allowed = load(None, env(HTTP_TOKEN_FILE=str(secret)), allow_insecure_permissions=True)
    assert allowed.http.token == "tk_secret_in_file_7Hq2X"


def test_a_non_secret_file_key_is_not_permission_checked(tmp_path: Path) -> None:
    url = write(tmp_path, "https://ntfy.example.com\n", "url")
    url.chmod(0o644)
    assert load(None, {"NTFY_INTAKE_NTFY_URL_FILE": str(url), "NTFY_INTAKE_NTFY_TOPICS": "a"})


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with 'whsec_'"),
        ("whsec_not*base64*at*all", "not valid base64"),
        ("whsec_c2hvcnQ=", "24-64 bytes"),
    ],
)
def test_a_bad_webhook_secret_stops_start_up_without_echoing_it(value: str, why: str) -> None:
    message = error_of(lambda: load(None, env(RELAY_SECRET=value)), "relay.secret")
    assert why in message and value not in message


def test_the_webhook_secret_and_relay_token_are_redacted() -> None:
    s = load(None, env(RELAY_SECRET=WEBHOOK_SECRET, RELAY_TOKEN="rx-token"))
    assert s.relay.signing_key is not None and len(s.relay.signing_key) == 24
    assert s.redacted()["relay"] == {
        "url": None,
        "timeout": "10s",
        "max_attempts": 8,
        "secret": "***",
        "token": "***",
        "concurrency": 4,
        "escalate_after": "10m",
        "escalate_min_severity": 4,
        "escalate_daily_cap": 5,
        "escalate_handle": None,
    }
    assert WEBHOOK_SECRET not in repr(s) and "rx-token" not in repr(s)


def test_cli_refuses_a_readable_secret_with_exit_2_and_one_line_and_honours_the_escape_hatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ntfy_intake import cli  # noqa: PLC0415

    path = write(tmp_path, MINIMAL_TOML + 'token = "tk_inline"\n[state]\ndir = "state"\n')
    path.chmod(0o644)
    assert cli.main(["status", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "readable by group or others" in err
    # Past the check, status reports that there is no state yet (exit 1), not a config error.
    assert cli.main(["status", "--config", str(path), "--allow-insecure-permissions"]) == 1
    assert "no state yet" in capsys.readouterr().err


def test_every_config_error_is_reported_at_once_one_line_each(tmp_path: Path) -> None:
    text = (
        '[ntfy]\nurl = "ftp://x"\ntopics = ["alerts"]\nkeepalive_timeout = "soon"\n'
        'colour = "red"\n[cadence]\ndaily_cap = -1\ntimezone = "Mars/Olympus"\n[bogus]\nx = 1\n'
    )
    with pytest.raises(settings.ConfigErrors) as info:
        load_toml(tmp_path, text, {"NTFY_INTAKE_HTTP_LISTEN": "nowhere"})
    lines = str(info.value).splitlines()
    keys = [line.split(":")[1].strip() for line in lines]
    assert all(line.startswith("config error: ") for line in lines)
    for key in (
        "ntfy.url",
        "ntfy.keepalive_timeout",
        "ntfy.colour",
        "cadence.daily_cap",
        "cadence.timezone",
        "bogus",
        "http.listen (NTFY_INTAKE_HTTP_LISTEN)",
    ):
        assert any(k.startswith(key) for k in keys), (key, lines)
    assert len(lines) == len(set(lines)) == 7
    assert info.value.key == keys[0]


def test_a_single_error_is_still_a_plain_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load(None, env(CADENCE_DAILY_CAP="-1"))
    assert not isinstance(info.value, settings.ConfigErrors)
    assert "\n" not in str(info.value)


def test_read_only_commands_do_not_need_the_ntfy_settings() -> None:
    loaded = load(None, {"NTFY_INTAKE_STATE_DIR": "/srv/state"}, need_ntfy=False)
    assert loaded.state.dir == Path("/srv/state") and loaded.ntfy.topics == ()


def test_missing_ntfy_settings_name_the_config_file_options() -> None:
    message = error_of(lambda: load(None, {}), "ntfy.url")
    assert "--config" in message and "/etc/ntfy-intake/config.toml" in message
    assert "NTFY_INTAKE_NTFY_URL" in message and "ntfy.topics" in message


def test_default_config_path_is_used_only_when_it_exists_and_nothing_else_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = tmp_path / "config.toml"
    monkeypatch.setattr(settings, "DEFAULT_CONFIG", default)
    assert settings.config_path(None, {}) is None
    default.write_text(MINIMAL_TOML)
    assert settings.config_path(None, {}) == default
    assert settings.config_path(Path("/x.toml"), {}) == Path("/x.toml")
    assert settings.config_path(None, {"NTFY_INTAKE_CONFIG": "/y.toml"}) is None  # load reads it


def test_overlap_shorter_than_reorder_window_plus_delayed_sender_is_refused() -> None:
    base = {env_name("ntfy", "url"): "http://x", env_name("ntfy", "topics"): "a"}
    with pytest.raises(ConfigError, match=r"ntfy.overlap.*at least ntfy.reorder_window \+ 10s"):
        load(
            None,
            {**base, env_name("ntfy", "reorder_window"): "25s", env_name("ntfy", "overlap"): "30s"},
        )
    # Unset, the overlap follows a long reorder window instead of failing on a key nobody wrote.
    assert load(None, {**base, env_name("ntfy", "reorder_window"): "25s"}).ntfy.overlap == 35
    assert load(None, base).ntfy.overlap == 30 and load(None, base).ntfy.cache_settle == 2


@pytest.mark.parametrize("value", ["0", "17", "-1"])
def test_relay_concurrency_outside_1_to_16_is_refused(value: str) -> None:
    message = error_of(lambda: load(None, env(RELAY_CONCURRENCY=value)), "relay.concurrency")
    assert f"must be from 1 to 16, got {value}" in message


def test_relay_concurrency_defaults_to_4_and_one_means_serial() -> None:
    assert load(None, env()).relay.concurrency == 4
    assert load(None, env(RELAY_CONCURRENCY="1")).relay.concurrency == 1
