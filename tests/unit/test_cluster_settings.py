"""The `[cluster]` settings (issue 24, DESIGN.md section 9): defaults, env twins, durations, the
3x rule, the refusal on SQLite and the node's name, each from an empty environment mapping."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping
from pathlib import Path

import pytest

from ntfy_intake.errors import ConfigError
from ntfy_intake.rules import lease
from ntfy_intake.settings import ClusterSettings, ConfigErrors, Settings, env_name, load
from ntfy_intake.settings.cluster import NEEDS_DATABASE

BASE: dict[str, str] = {
    "NTFY_INTAKE_NTFY_URL": "https://ntfy.example.com",
    "NTFY_INTAKE_NTFY_TOPICS": "alerts",
}
PG = BASE | {"NTFY_INTAKE_STATE_DATABASE": "postgresql://intake@db.lan/intake"}
NTFY = '[ntfy]\nurl = "https://ntfy.example.com"\ntopics = ["alerts"]\n'
PG_TOML = NTFY + '[state]\ndatabase = "postgresql://intake@db.lan/intake"\n'


@pytest.fixture(autouse=True)
def host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A known host name, whatever machine runs the tests."""
    monkeypatch.setattr(socket, "gethostname", lambda: "pi-a")


def cluster_env(**keys: str) -> dict[str, str]:
    """PG plus `NTFY_INTAKE_CLUSTER_<KEY>` values: cluster_env(lease_ttl="9s")."""
    return PG | {env_name("cluster", key): value for key, value in keys.items()}


def load_toml(tmp_path: Path, text: str, environ: Mapping[str, str] | None = None) -> Settings:
    path = tmp_path / "config.toml"
    path.write_text(text)
    path.chmod(0o600)  # it holds state.database, a secret
    return load(path, environ or {})


def error_of(call: object, key: str) -> ConfigError:
    """Run `call`, expect exactly one ConfigError naming `key`, one line; return it."""
    assert callable(call)
    with pytest.raises(ConfigError) as info:
        call()
    assert not isinstance(info.value, ConfigErrors), str(info.value)
    message = str(info.value)
    assert message.startswith(f"config error: {key}"), message
    assert info.value.key.split(" ")[0] == key
    assert "\n" not in message and "\r" not in message
    return info.value


# ----------------------------------------------------------------------------------------------------
# Defaults and sources


def test_env_twin_names() -> None:
    assert env_name("cluster", "node") == "NTFY_INTAKE_CLUSTER_NODE"
    assert env_name("cluster", "lease_ttl") == "NTFY_INTAKE_CLUSTER_LEASE_TTL"
    assert env_name("cluster", "renew_every") == "NTFY_INTAKE_CLUSTER_RENEW_EVERY"


@pytest.mark.parametrize("environ", [BASE, PG], ids=["sqlite", "postgresql"])
def test_cluster_is_always_there_with_the_defaults(environ: dict[str, str]) -> None:
    assert load(None, environ).cluster == ClusterSettings("pi-a", 8.0, 2.0, configured=False)


def test_the_default_node_is_the_host_name_at_load_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "nas-2")
    assert load(None, PG).cluster.node == "nas-2"


def test_the_file_sets_every_key_and_marks_the_section_configured(tmp_path: Path) -> None:
    text = PG_TOML + '[cluster]\nnode = "pi-b"\nlease_ttl = "12s"\nrenew_every = "3s"\n'
    cluster = load_toml(tmp_path, text).cluster
    assert cluster == ClusterSettings("pi-b", 12.0, 3.0, configured=True)


@pytest.mark.parametrize("key", ["node", "lease_ttl", "renew_every"])
def test_any_one_key_given_makes_it_configured(key: str) -> None:
    value = {"node": "pi-b", "lease_ttl": "9s", "renew_every": "1s"}[key]
    assert load(None, cluster_env(**{key: value})).cluster.configured


def test_an_empty_cluster_table_is_not_configured(tmp_path: Path) -> None:
    assert not load_toml(tmp_path, NTFY + "[cluster]\n").cluster.configured


def test_env_twins_set_each_key() -> None:
    cluster = load(None, cluster_env(node="pi-c", lease_ttl="1m", renew_every="10s")).cluster
    assert cluster == ClusterSettings("pi-c", 60.0, 10.0, configured=True)


def test_env_beats_the_file_per_key(tmp_path: Path) -> None:
    text = PG_TOML + '[cluster]\nnode = "from-file"\nlease_ttl = "12s"\n'
    cluster = load_toml(tmp_path, text, {env_name("cluster", "node"): "from-env"}).cluster
    assert (cluster.node, cluster.lease_ttl, cluster.renew_every) == ("from-env", 12.0, 2.0)


def test_env_values_are_trimmed_and_an_empty_one_is_unset() -> None:
    cluster = load(None, cluster_env(node="  pi-d  ", lease_ttl="")).cluster
    assert (cluster.node, cluster.lease_ttl) == ("pi-d", 8.0)


def test_the_node_can_come_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "node").write_text("pi-e\n")  # not a secret: its mode is not checked
    environ = PG | {env_name("cluster", "node") + "_FILE": str(tmp_path / "node")}
    assert load(None, environ).cluster.node == "pi-e"


def test_sub_second_durations_are_accepted() -> None:
    cluster = load(None, cluster_env(lease_ttl="1500ms", renew_every="500ms")).cluster
    assert (cluster.lease_ttl, cluster.renew_every) == (1.5, 0.5)


def test_cluster_settings_are_frozen() -> None:
    cluster = load(None, PG).cluster
    with pytest.raises(dataclasses.FrozenInstanceError):
        cluster.node = "other"  # type: ignore[misc]


def test_an_unknown_cluster_key_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    error = error_of(
        lambda: load_toml(tmp_path, PG_TOML + '[cluster]\nlease_tll = "8s"\n'), "cluster.lease_tll"
    )
    assert "did you mean lease_ttl?" in str(error)


# ----------------------------------------------------------------------------------------------------
# Bad durations


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("soon", "expected a duration like 45s, got 'soon'"),
        ("8", "a number needs a unit"),
        ("0s", "must be longer than 0s, got 0s"),
        ("-2s", "expected a duration like 45s"),
        ("2s1m", "units must go from largest to smallest"),
    ],
)
@pytest.mark.parametrize("key", ["lease_ttl", "renew_every"])
def test_a_bad_duration_from_the_env_names_the_key_and_its_twin(
    key: str, raw: str, says: str
) -> None:
    error = error_of(lambda: load(None, cluster_env(**{key: raw})), f"cluster.{key}")
    assert error.key == f"cluster.{key} ({env_name('cluster', key)})"
    assert says in error.problem


def test_a_bare_number_in_the_file_is_refused_with_a_hint(tmp_path: Path) -> None:
    error = error_of(
        lambda: load_toml(tmp_path, PG_TOML + "[cluster]\nlease_ttl = 8\n"), "cluster.lease_ttl"
    )
    assert "bare number 8: use a duration like 8s" in error.problem


# ----------------------------------------------------------------------------------------------------
# The 3x rule (lease.check_timing)


def test_lease_ttl_under_three_renewals_is_refused_on_lease_ttl() -> None:
    error = error_of(lambda: load(None, cluster_env(lease_ttl="5s")), "cluster.lease_ttl")
    assert error.problem == lease.check_timing(5.0, 2.0)
    assert error.key == "cluster.lease_ttl (NTFY_INTAKE_CLUSTER_LEASE_TTL)"


def test_only_renew_every_given_is_refused_on_renew_every(tmp_path: Path) -> None:
    """The default lease_ttl is nobody's mistake: name the key that was written."""
    text = PG_TOML + '[cluster]\nnode = "pi-b"\nrenew_every = "3s"\n'
    error = error_of(lambda: load_toml(tmp_path, text), "cluster.renew_every")
    assert error.problem == lease.check_timing(8.0, 3.0)


def test_both_given_is_refused_on_lease_ttl_once() -> None:
    error = error_of(
        lambda: load(None, cluster_env(lease_ttl="5s", renew_every="3s")), "cluster.lease_ttl"
    )
    assert error.problem == lease.check_timing(5.0, 3.0)


@pytest.mark.parametrize(("ttl", "renew"), [("6s", "2s"), ("3s", "1s"), ("1m", "20s")])
def test_exactly_three_renewals_is_enough(ttl: str, renew: str) -> None:
    cluster = load(None, cluster_env(lease_ttl=ttl, renew_every=renew)).cluster
    assert lease.check_timing(cluster.lease_ttl, cluster.renew_every) is None


def test_read_only_commands_get_the_same_timing_refusal() -> None:
    """`need_ntfy=False` (status, check, ...) reads the same config: the same refusal."""
    error_of(lambda: load(None, cluster_env(lease_ttl="4s"), need_ntfy=False), "cluster.lease_ttl")


# ----------------------------------------------------------------------------------------------------
# [cluster] without [state] database


@pytest.mark.parametrize(
    ("key", "value"), [("node", "pi-b"), ("lease_ttl", "9s"), ("renew_every", "1s")]
)
def test_any_cluster_key_in_the_env_on_sqlite_is_refused(key: str, value: str) -> None:
    environ = BASE | {env_name("cluster", key): value}
    error = error_of(lambda: load(None, environ), f"cluster.{key}")
    assert error.problem == NEEDS_DATABASE
    assert str(error) == (
        f"config error: cluster.{key} ({env_name('cluster', key)}): [cluster] needs [state]"
        " database (PostgreSQL): a standby shares one database with its leader"
    )


def test_a_cluster_section_in_the_file_on_sqlite_is_refused_in_one_line(tmp_path: Path) -> None:
    text = NTFY + '[cluster]\nnode = "pi-b"\nlease_ttl = "9s"\nrenew_every = "1s"\n'
    error = error_of(lambda: load_toml(tmp_path, text), "cluster.node")
    assert str(error) == f"config error: cluster.node: {NEEDS_DATABASE}"


def test_the_sqlite_refusal_is_reported_with_a_bad_value_of_another_section() -> None:
    environ = BASE | {env_name("cluster", "node"): "pi-b", "NTFY_INTAKE_CADENCE_DAILY_CAP": "-1"}
    with pytest.raises(ConfigErrors) as info:
        load(None, environ)
    keys = [error.key.split(" ")[0] for error in info.value.errors]
    assert keys == ["cluster.node", "cadence.daily_cap"]


def test_a_bad_cluster_value_on_sqlite_is_reported_with_the_refusal() -> None:
    with pytest.raises(ConfigErrors) as info:
        load(None, BASE | {env_name("cluster", "lease_ttl"): "soon"})
    assert [e.problem for e in info.value.errors] == [
        "expected a duration like 45s, got 'soon'",
        NEEDS_DATABASE,
    ]


def test_a_bad_database_value_is_not_also_called_sqlite() -> None:
    """`[state] database` given but wrong: the operator meant PostgreSQL; one error, on it."""
    environ = BASE | {
        "NTFY_INTAKE_STATE_DATABASE": "mysql://x",
        env_name("cluster", "node"): "pi-b",
    }
    error_of(lambda: load(None, environ), "state.database")


def test_an_unreadable_database_file_is_not_also_called_sqlite(tmp_path: Path) -> None:
    environ = BASE | {
        "NTFY_INTAKE_STATE_DATABASE_FILE": str(tmp_path / "missing.dsn"),
        env_name("cluster", "node"): "pi-b",
    }
    error_of(lambda: load(None, environ), "state.database")


def test_the_database_from_the_file_and_cluster_from_the_env_is_fine(tmp_path: Path) -> None:
    cluster = load_toml(tmp_path, PG_TOML, {env_name("cluster", "node"): "pi-b"}).cluster
    assert (cluster.node, cluster.configured) == ("pi-b", True)


# ----------------------------------------------------------------------------------------------------
# The node's name


@pytest.mark.parametrize(
    ("node", "says"),
    [
        ("pi a", "must not contain whitespace, got 'pi a'"),
        ("pi\u00a0a", "must not contain"),  # a no-break space: not printable for Python, refused
        ("pi\ta", "must not contain control characters"),
        ("x" * 64, "must be at most 63 characters (64 here)"),
        ("", "must not be empty"),
        (" pi-a", "must not contain whitespace"),  # the file's value is exact, never trimmed
    ],
)
def test_a_bad_node_in_the_file_is_refused(tmp_path: Path, node: str, says: str) -> None:
    text = PG_TOML + "[cluster]\nnode = " + _toml_string(node) + "\n"
    error = error_of(lambda: load_toml(tmp_path, text), "cluster.node")
    assert says in error.problem


def _toml_string(text: str) -> str:
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text) + '"'


@pytest.mark.parametrize("node", ["x" * 63, "pi-a.lan", "Ünïcode-box", "node_1"])
def test_a_good_node_is_kept_exactly(node: str) -> None:
    assert load(None, cluster_env(node=node)).cluster.node == node


def test_an_unusable_host_name_on_postgresql_asks_for_a_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 64)
    error = error_of(lambda: load(None, PG), "cluster.node")
    assert "host name" in error.problem and "NTFY_INTAKE_CLUSTER_NODE" in error.problem
    assert "at most 63 characters" in error.problem
    # Setting the node fixes it.
    assert load(None, cluster_env(node="pi-b")).cluster.node == "pi-b"


@pytest.mark.parametrize(
    ("host", "fitted"), [("h" * 70, "h" * 63), ("my box\n", "mybox"), ("", "localhost")]
)
def test_an_unusable_host_name_on_sqlite_never_stops_a_one_box_install(
    monkeypatch: pytest.MonkeyPatch, host: str, fitted: str
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    assert load(None, BASE).cluster.node == fitted


def test_a_host_name_that_cannot_be_read_is_no_node(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails() -> str:
        raise OSError("no host name")

    monkeypatch.setattr(socket, "gethostname", fails)
    error_of(lambda: load(None, PG), "cluster.node")
    assert load(None, BASE).cluster.node == "localhost"


# ----------------------------------------------------------------------------------------------------
# The effective configuration


def test_redacted_shows_cluster_on_postgresql_in_config_syntax() -> None:
    out = load(None, cluster_env(lease_ttl="1m30s")).redacted()
    assert out["cluster"] == {
        "node": "pi-a",
        "lease_ttl": "1m30s",
        "renew_every": "2s",
        "url": None,
        "probe_every": "10s",
        "yield_after": "1m",
        "yield_cooloff": "5m",
    }


def test_redacted_shows_cluster_unset_on_sqlite() -> None:
    assert load(None, BASE).redacted()["cluster"] == {
        "node": None,
        "lease_ttl": None,
        "renew_every": None,
        "url": None,
        "probe_every": None,
        "yield_after": None,
        "yield_cooloff": None,
    }


def test_redacted_cluster_loads_back_to_the_same_values() -> None:
    original = load(None, PG)
    shown = original.redacted()["cluster"]
    assert isinstance(shown, dict)
    given = {key: str(value) for key, value in shown.items() if value is not None}
    again = load(None, cluster_env(**given)).cluster
    assert dataclasses.replace(again, configured=False) == original.cluster


def test_the_advertised_url_is_a_base_url_kept_without_its_trailing_slash() -> None:
    assert (
        load(None, cluster_env(url="http://pi-a.lan:8080/")).cluster.url == "http://pi-a.lan:8080"
    )
    assert load(None, PG).cluster.url is None
    error_of(lambda: load(None, cluster_env(url="http://pi-a.lan:8080/console")), "cluster.url")
    error_of(lambda: load(None, cluster_env(url="pi-a.lan:8080")), "cluster.url")


def test_credentials_in_the_advertised_url_never_show_in_the_effective_settings() -> None:
    shown = load(None, cluster_env(url="http://owner:hunter2@pi-a.lan:8080")).redacted()
    assert "hunter2" not in str(shown)
