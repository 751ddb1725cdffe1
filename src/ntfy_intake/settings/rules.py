"""The rules per section: typed reads of raw values, defaults, and the cross-key checks, each
failure one `ConfigError` naming `section.key`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, NoReturn
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ntfy_intake.errors import ConfigError
from ntfy_intake.rules.durations import format_duration, parse_duration
from ntfy_intake.settings import dsn as dsn_rules
from ntfy_intake.settings import token as strength
from ntfy_intake.settings.schema import (
    _URL_KEYS,
    CONFIG_ENV,
    DEFAULT_CONFIG,
    DEFAULT_STATE_DIR,
    DELAYED_SENDER_PERIOD,
    DISALLOWED_TOPICS,
    GROUP_RE,
    MAX_INT,
    PHONE_RE,
    SECRET_KEYS,
    TOPIC_RE,
    CadenceSettings,
    Dsn,
    FirstStart,
    HealthSettings,
    HttpSettings,
    NtfySettings,
    OwnerSettings,
    RelaySettings,
    StateSettings,
    _mask_url,
    env_name,
    split_listen,
)
from ntfy_intake.settings.sources import _type_name, _Value
from ntfy_intake.wire import signing


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
        profiles=_profiles(r),
    )


def _profiles(r: _Reader) -> Literal["auto", "off"]:
    text = r.text("ntfy", "profiles")
    if text is None or text == "auto":
        return "auto"
    if text == "off":
        return "off"
    shown = r.show("ntfy", "profiles", text)
    r.fail("ntfy", "profiles", f'expected "auto" or "off", got {shown}')


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


def _state(r: _Reader, environ: Mapping[str, str]) -> StateSettings:
    return StateSettings(dir=_state_dir(r, environ), database=_database(r))


def _database(r: _Reader) -> Dsn | None:
    """`[state] database`: a PostgreSQL DSN read by libpq's parser (settings/dsn.py), or unset
    for SQLite in the state dir."""
    text = r.text("state", "database")
    if text is None:
        return None
    try:
        dsn_rules.check(text)
    except dsn_rules.DsnError as exc:
        r.fail("state", "database", str(exc))
    return Dsn(text)


def _state_dir(r: _Reader, environ: Mapping[str, str]) -> Path:
    text = r.text("state", "dir")
    if text is None:
        systemd = environ.get("STATE_DIRECTORY", "").split(":")[0]
        return Path(systemd) if systemd else DEFAULT_STATE_DIR
    base = r.base("state", "dir")
    return base / text if base is not None else Path(text)


MAX_RELAY_CONCURRENCY = 16


def _relay(r: _Reader) -> RelaySettings:
    attempts = r.integer("relay", "max_attempts")
    if attempts is not None and attempts < 1:
        r.fail("relay", "max_attempts", f"must be at least 1, got {attempts}")
    concurrency = r.integer("relay", "concurrency")
    if concurrency is not None and not 1 <= concurrency <= MAX_RELAY_CONCURRENCY:
        r.fail(
            "relay",
            "concurrency",
            f"must be from 1 to {MAX_RELAY_CONCURRENCY}, got {concurrency}",
        )
    min_severity = r.integer("relay", "escalate_min_severity")
    if min_severity is not None and not 1 <= min_severity <= 5:
        r.fail("relay", "escalate_min_severity", f"must be from 1 to 5, got {min_severity}")
    escalate_cap = r.integer("relay", "escalate_daily_cap")
    if escalate_cap is not None and escalate_cap < 0:
        r.fail("relay", "escalate_daily_cap", f"must be at least 0, got {escalate_cap}")
    handle = r.text("relay", "escalate_handle")
    if handle is not None and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}", handle) is None:
        r.fail("relay", "escalate_handle", "not a feed handle (1-64 of A-Z a-z 0-9 _ . : @ -)")
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
        concurrency=4 if concurrency is None else concurrency,
        escalate_after=_duration(r, "relay", "escalate_after", 600.0, 0.0),
        escalate_min_severity=4 if min_severity is None else min_severity,
        escalate_daily_cap=5 if escalate_cap is None else escalate_cap,
        escalate_handle=handle,
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
    receive = r.text("owner", "receive") or "off"
    if receive not in ("poll", "websocket", "off"):
        r.fail("owner", "receive", f"expected poll, websocket or off, got {receive!r}")
    if receive != "off" and signal_url is None:
        r.fail("owner", "receive", "needs owner.signal_url (replies come over Signal)")
    reply_from = r.strings("owner", "reply_from") or ()
    for sender in reply_from:
        if not (PHONE_RE.fullmatch(sender) or _UUID_RE.fullmatch(sender)):
            r.fail(
                "owner",
                "reply_from",
                f"expected a number like +4915112345678 or a UUID, got {sender!r}",
            )
    return OwnerSettings(
        signal_url=signal_url,
        signal_number=number,
        recipients=recipients,
        fallback_topic=fallback,
        receive=receive,
        receive_every=_duration(r, "owner", "receive_every", 5.0, 1.0),
        reply_from=reply_from,
        receive_dead_after=_duration(r, "owner", "receive_dead_after", 600.0, 60.0),
    )


_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _http(r: _Reader) -> HttpSettings:
    listen = r.text("http", "listen") or "127.0.0.1:8788"
    try:
        split_listen(listen)
    except ValueError as exc:
        r.fail("http", "listen", f"{exc}, got {r.show('http', 'listen', listen)}")
    token = _token(r, "http")
    if token is not None and (weak := strength.weakness(token)) is not None:
        r.fail("http", "token", strength.refusal(weak))
    public_url = _url(r, "http", "public_url", query=False)
    return HttpSettings(listen=listen, token=token, public_url=public_url)


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
