"""The PostgreSQL engine's pure parts: placeholders, rows, the DSN that never shows its password,
and the start-up line a refused login becomes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ntfy_intake import settings
from ntfy_intake.errors import ConfigError, DatabaseUnreachable, StartupError
from ntfy_intake.settings.schema import Dsn
from ntfy_intake.store import postgres, storage

BASE = {"NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:1", "NTFY_INTAKE_NTFY_TOPICS": "alerts"}


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT ? , ?", "SELECT %s , %s"),
        ("WHERE a = :now AND b <= :now", "WHERE a = %(now)s AND b <= %(now)s"),
        ("SELECT '50%' || ?", "SELECT '50%%' || %s"),
        ("SELECT 'a?b', ':x'", "SELECT 'a?b', ':x'"),
        ("SELECT CAST(x AS json)", "SELECT CAST(x AS json)"),
        ("SELECT x::text", "SELECT x::text"),
        ("SELECT 'it''s ?'", "SELECT 'it''s ?'"),
    ],
)
def test_placeholders_become_psycopgs_and_literals_stay(sql: str, expected: str) -> None:
    assert postgres.translate(sql) == expected


def test_a_row_reads_by_position_and_by_name() -> None:
    row = postgres.Row((1, "a"), {"seq": 0, "line": 1})
    assert (row[0], row["line"], tuple(row), row.keys()) == (1, "a", (1, "a"), ["seq", "line"])
    assert row == (1, "a")


def test_nul_in_text_is_stored_as_replacement_not_refused() -> None:
    """Failure mode: PostgreSQL refuses text holding NUL: the whole batch would fail."""
    assert postgres._params(("a\x00b", 1, None)) == ("a\ufffdb", 1, None)
    assert postgres._params({"k": "\x00"}) == {"k": "\ufffd"}


def test_array_parameters_map_each_string_and_plain_parameters_pass_as_they_are() -> None:
    """An array parameter (the delete/clear link's unnest) holds text too: its NULs are mapped
    as a scalar's, or a lookup would miss the row stored with U+FFFD. Parameters with nothing to
    map go to the driver as they came (no copy per statement)."""
    assert postgres._params((["a\x00", "b"], 1)) == (["a\ufffd", "b"], 1)
    plain = ("a", 1, None, 2.5)
    assert postgres._params(plain) is plain


def test_a_dsn_is_shown_without_its_password() -> None:
    dsn = Dsn("postgresql://intake:hunter2@nas.lan:5433/alerts?sslmode=require")
    assert str(dsn) == "postgresql://intake@nas.lan:5433/alerts"
    assert "hunter2" not in repr(dsn)
    assert (dsn.host, dsn.database) == ("nas.lan", "alerts")


def test_database_file_is_read_as_a_secret_and_never_echoed(tmp_path: Path) -> None:
    secret = tmp_path / "dsn"
    secret.write_text("postgresql://intake:hunter2@nas.lan/alerts\n")
    os.chmod(secret, 0o600)
    loaded = settings.load(None, {**BASE, "NTFY_INTAKE_STATE_DATABASE_FILE": str(secret)})
    assert str(loaded.state.store) == "postgresql://intake@nas.lan/alerts"
    assert "hunter2" not in repr(loaded.state) + str(loaded.redacted())


def test_a_database_that_is_not_a_postgresql_uri_is_refused_without_its_value() -> None:
    with pytest.raises(ConfigError) as refused:
        settings.load(None, {**BASE, "NTFY_INTAKE_STATE_DATABASE": "mysql://u:hunter2@x/y"})
    assert "state.database" in str(refused.value)
    assert "hunter2" not in str(refused.value)


class _Refused(Exception):
    sqlstate = "28P01"


class _Missing(Exception):
    sqlstate = "3D000"


def test_a_refused_password_exits_with_one_line_naming_host_and_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgres, "DRIVER_ERRORS", (_Refused, _Missing))
    dsn = Dsn("postgresql://intake:hunter2@nas.lan/alerts")
    error = storage.startup_error(_Refused('password authentication failed for user "intake"'), dsn)
    assert isinstance(error, StartupError)
    assert str(error).startswith("PostgreSQL postgresql://intake@nas.lan/alerts: database refused")
    assert "\n" not in str(error) and "hunter2" not in str(error)
    missing = storage.startup_error(_Missing('database "alerts" does not exist'), dsn)
    assert isinstance(missing, StartupError) and "no such database" in str(missing)


def test_an_unreachable_server_at_start_up_is_waited_out_not_an_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class _Down(Exception):
        sqlstate = None

    monkeypatch.setattr(postgres, "DRIVER_ERRORS", (_Down,))
    monkeypatch.setattr(postgres, "DRIVER_OPERATIONAL", _Down)
    error = storage.startup_error(
        _Down("connection failed: Connection refused"), Dsn("postgresql://nas.lan/x")
    )
    assert isinstance(error, DatabaseUnreachable) and not isinstance(error, StartupError)


def test_a_dsn_without_the_postgres_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Failure mode: a one-box install that sets a DSN without psycopg gets an ImportError
    traceback instead of one line."""
    monkeypatch.setattr(postgres, "DRIVER_ERRORS", ())  # not loaded yet
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what a missing extra is to an import
    postgres._driver.cache_clear()
    try:
        with pytest.raises(StartupError, match=r"install ntfy-intake\[postgres\]") as refused:
            postgres.connect(Dsn("postgresql://intake:hunter2@nas.lan/alerts"))
    finally:
        postgres._driver.cache_clear()
    assert "hunter2" not in str(refused.value)
