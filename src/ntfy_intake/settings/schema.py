"""The settings tree and its keys: every (section, key), its type, which keys are secrets,
and the frozen dataclasses the rest of the daemon reads. No I/O."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar
from zoneinfo import ZoneInfo

from ntfy_intake.rules.durations import format_duration
from ntfy_intake.rules.expectations import Expectation
from ntfy_intake.rules.maintenance import Window
from ntfy_intake.settings import dsn as dsn_rules
from ntfy_intake.wire import signing

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
MAX_NODE_LENGTH = 63  # a DNS label: a host name's first part fits
DEFAULT_LEASE_TTL = 8.0
DEFAULT_RENEW_EVERY = 2.0
DEFAULT_PROBE_EVERY = 10.0  # readiness per node (DESIGN.md section 11)
DEFAULT_YIELD_AFTER = 60.0
DEFAULT_YIELD_COOLOFF = 300.0

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
    ("ntfy", "profiles"): "str",
    ("state", "dir"): "str",
    ("state", "database"): "str",
    ("cluster", "node"): "str",
    ("cluster", "lease_ttl"): "duration",
    ("cluster", "renew_every"): "duration",
    ("cluster", "url"): "str",
    ("cluster", "probe_every"): "duration",
    ("cluster", "yield_after"): "duration",
    ("cluster", "yield_cooloff"): "duration",
    ("relay", "url"): "str",
    ("relay", "timeout"): "duration",
    ("relay", "max_attempts"): "int",
    ("relay", "secret"): "str",
    ("relay", "token"): "str",
    ("relay", "concurrency"): "int",
    ("relay", "escalate_after"): "duration",
    ("relay", "escalate_min_severity"): "int",
    ("relay", "escalate_daily_cap"): "int",
    ("relay", "escalate_handle"): "str",
    ("cadence", "debounce"): "duration",
    ("cadence", "cooldown"): "duration",
    ("cadence", "daily_cap"): "int",
    ("cadence", "timezone"): "str",
    ("owner", "signal_url"): "str",
    ("owner", "signal_number"): "str",
    ("owner", "recipients"): "list",
    ("owner", "fallback_topic"): "str",
    ("owner", "receive"): "str",
    ("owner", "receive_every"): "duration",
    ("owner", "reply_from"): "list",
    ("owner", "receive_dead_after"): "duration",
    ("http", "listen"): "str",
    ("http", "token"): "str",
    ("http", "public_url"): "str",
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
        # A DSN may carry a password: shown as host and database only.
        ("state", "database"),
    }
)
_URL_KEYS = frozenset(
    {
        ("ntfy", "url"),
        ("relay", "url"),
        ("owner", "signal_url"),
        ("cluster", "url"),
        ("http", "public_url"),
    }
)
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
    # Publisher profiles (DESIGN.md section 12): "auto" recognises known publishers' payloads,
    # "off" keys every message by the envelope or the title rule alone.
    profiles: Literal["auto", "off"] = "auto"


DSN_SCHEMES = dsn_rules.SCHEMES


def is_dsn(value: object) -> bool:
    """A PostgreSQL connection string (`[state] database`: a URI or libpq's key=value words),
    not a file path."""
    text = value.conninfo if isinstance(value, Dsn) else str(value)
    return dsn_rules.looks_like_dsn(text)


@dataclass(frozen=True, slots=True)
class Dsn:
    """A PostgreSQL connection string, read by libpq's own parser (settings/dsn.py). Its `str`
    names user, host, port and database and never the password (a DSN with a password is a
    secret: DESIGN.md sections 8 and 11)."""

    conninfo: str

    def __str__(self) -> str:
        return self.where

    def __repr__(self) -> str:
        return f"Dsn({self.where!r})"

    @property
    def where(self) -> str:
        return dsn_rules.describe(self.conninfo)

    @property
    def host(self) -> str:
        return dsn_rules.host(self.conninfo)

    @property
    def database(self) -> str:
        return dsn_rules.database(self.conninfo)

    def redact(self, message: str) -> str:
        """`message` without this DSN's password in any form libpq or psycopg could print it."""
        return dsn_rules.redact(message, self.conninfo)


@dataclass(frozen=True, slots=True)
class StateSettings:
    dir: Path
    # `[state] database`: PostgreSQL (DESIGN.md section 9); None = SQLite in `dir`.
    database: Dsn | None = dataclasses.field(default=None, repr=False)

    @property
    def store(self) -> Path | Dsn:
        """Where the store lives: the PostgreSQL database, or SQLite's file in `dir`."""
        return self.database if self.database is not None else self.dir / "intake.sqlite3"

    @property
    def database_file(self) -> Path:
        """Where the SQLite engine keeps the store (the default, and `store copy`'s source)."""
        return self.dir / "intake.sqlite3"

    @property
    def audit_dir(self) -> Path:
        return self.dir / "audit"


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """`[cluster]`: this daemon's part in leadership by lease (DESIGN.md section 9).

    Always present: on PostgreSQL every daemon takes part in leadership, with these defaults
    when no key was given; on SQLite (a single box) nothing reads it, and giving any key there
    is a ConfigError. The timing satisfies `rules.lease.check_timing`."""

    node: str  # default: the host name
    lease_ttl: float = DEFAULT_LEASE_TTL
    renew_every: float = DEFAULT_RENEW_EVERY
    # This node's HTTP surface as the other nodes' owners reach it (http://pi.lan:8080): a
    # standby's console links there and posts its forms there. None: not advertised.
    url: str | None = None
    # Readiness (DESIGN.md section 11): how often each node probes that it could do the work;
    # how long a leader's intake may be dead (or latched) before it yields to a ready node; how
    # long a node that yielded leaves the lease to the others.
    probe_every: float = DEFAULT_PROBE_EVERY
    yield_after: float = DEFAULT_YIELD_AFTER
    yield_cooloff: float = DEFAULT_YIELD_COOLOFF
    # Whether any [cluster] key was given (file or environment): where the values came from,
    # not a key of its own.
    configured: bool = dataclasses.field(default=False, metadata={"key": False})


@dataclass(frozen=True, slots=True)
class RelaySettings:
    url: str | None
    timeout: float
    max_attempts: int
    secret: str | None = dataclasses.field(
        default=None, repr=False
    )  # `whsec_...`: Standard Webhooks signing
    token: str | None = dataclasses.field(default=None, repr=False)  # optional receiver bearer
    concurrency: int = 4  # deliveries in flight at once, never two of one incident
    # Escalation when the agent is silent (flow/escalator.py): seconds after a request's release
    # without a 2xx before the daemon tells the owner itself (0 = off), the least severity that
    # does, and those messages' own daily cap.
    escalate_after: float = 600.0
    escalate_min_severity: int = 4
    escalate_daily_cap: int = 5
    # Without `url` the feed is the only consumer: a triage entry this feed handle has not acked
    # within escalate_after escalates (None: no escalation for the feed).
    escalate_handle: str | None = None

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
    # Replies from the phone (DESIGN.md section 13): "poll" | "websocket" | "off".
    receive: str = "off"
    receive_every: float = 5.0
    reply_from: tuple[str, ...] = ()  # who else may answer (numbers or UUIDs)
    receive_dead_after: float = 600.0  # receiving failing this long: one notice


@dataclass(frozen=True, slots=True)
class HttpSettings:
    listen: str
    token: str | None = dataclasses.field(repr=False)
    # The address the owner's browser uses (https://intake.home.lan): requests whose Host names
    # anything but it, the listen host, loopback or an IP literal are refused (DNS rebinding).
    public_url: str | None = None

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
    cluster: ClusterSettings
    relay: RelaySettings
    cadence: CadenceSettings
    owner: OwnerSettings
    http: HttpSettings
    health: HealthSettings
    # `[[maintenance]]` windows (settings/maintenance.py reads them, rules/maintenance.py holds).
    maintenance: tuple[Window, ...] = dataclasses.field(default=(), metadata={"section": False})
    # `[[expect]]` entries (settings/expectations.py reads them, rules/expectations.py holds).
    expect: tuple[Expectation, ...] = dataclasses.field(default=(), metadata={"section": False})

    def redacted(self) -> dict[str, object]:
        """Every key, JSON-able, for `status` and logs: secrets as "***" (None when unset), URL
        credentials masked, durations as duration strings; `[cluster]` only on PostgreSQL, the
        one engine it applies to (None, i.e. unset, on SQLite)."""
        out: dict[str, dict[str, object]] = {}
        for section, key in ALL_KEYS:
            value: object = getattr(getattr(self, section), key)
            if section == "cluster" and self.state.database is None:
                value = None
            elif (section, key) in SECRET_KEYS:
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
