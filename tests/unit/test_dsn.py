"""`[state] database` is read by libpq's own parser at config load (DESIGN.md section 11): a
password holding `%`, `@`, `:` or `/` is read whole when written right, a DSN libpq would misread
is one ConfigError naming the key, and no message ever holds the password or a fragment of it
(issue 32: `invalid percent-encoded token: "S3%CRET"` was printed whole, and a `p@ss` password
printed what follows its `@`)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from ntfy_intake import settings
from ntfy_intake.errors import ConfigError, DatabaseUnreachable, StartupError
from ntfy_intake.settings import dsn as dsn_rules
from ntfy_intake.settings.schema import Dsn
from ntfy_intake.store import db, postgres, storage

from ..dsn_cases import NAIVE_BROKEN, PASSWORDS, assert_never_shown, closed_port

BASE = {"NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:1", "NTFY_INTAKE_NTFY_TOPICS": "alerts"}
ENV = "NTFY_INTAKE_STATE_DATABASE"


def uri(password: str, *, encode: bool, port: int = 5432) -> str:
    shown = quote(password, safe="") if encode else password
    return f"postgresql://intake:{shown}@127.0.0.1:{port}/alerts"


def keywords(password: str, port: int = 5432) -> str:
    escaped = password.replace("\\", "\\\\").replace("'", "\\'")
    return f"host=127.0.0.1 port={port} user=intake dbname=alerts password='{escaped}'"


def load(value: str) -> settings.Settings:
    return settings.load(None, {**BASE, ENV: value})


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("form", ["uri", "keywords"])
def test_a_password_with_percent_at_colon_slash_written_right_is_read_whole(
    password: str, form: str
) -> None:
    """Failure mode: the URI parsed with urlsplit, not libpq, and the key=value form refused:
    what the daemon shows and what libpq connects with could differ."""
    text = uri(password, encode=True) if form == "uri" else keywords(password)
    loaded = load(text).state.database
    assert loaded is not None
    assert dsn_rules.parse(loaded.conninfo)["password"] == password
    assert str(loaded) == "postgresql://intake@127.0.0.1:5432/alerts"
    assert (loaded.host, loaded.database) == ("127.0.0.1", "alerts")
    assert_never_shown(repr(loaded) + str(loaded) + str(load(text).redacted()), password)


def test_a_colon_in_a_uri_password_is_read_whole_unencoded() -> None:
    """libpq reads the password up to the `@`: a `:` inside it needs no encoding."""
    loaded = load(uri("Kp4:Rt8", encode=False)).state.database
    assert loaded is not None
    assert dsn_rules.parse(loaded.conninfo)["password"] == "Kp4:Rt8"


@pytest.mark.parametrize("password", NAIVE_BROKEN)
def test_a_misread_uri_password_is_a_config_error_naming_the_key_never_the_value(
    password: str,
) -> None:
    """Failure mode (issue 32): `S3%CRET` passed config load and came back at connect as
    `invalid percent-encoded token: "S3%CRET"`, waited out for ever as unreachable; `Hq7@Zw9`
    came back as a host `Zw9@127.0.0.1` that does not resolve."""
    with pytest.raises(ConfigError) as refused:
        load(uri(password, encode=False))
    message = str(refused.value)
    assert message.startswith(f"config error: state.database ({ENV}): ")
    assert "\n" not in message and "percent-encode" in message
    assert_never_shown(message, password)


@pytest.mark.parametrize("password", ["Qw3?Er4@Ty5", "Qw3#Er4@Ty5", "Qw3?Er4/Ty5"])
def test_a_question_mark_before_a_stray_at_does_not_hide_the_misreading(password: str) -> None:
    """libpq looks for the end of the password past a `?`: an `@` or `/` after one in the
    password is misread all the same, and refused."""
    with pytest.raises(ConfigError) as refused:
        load(uri(password, encode=False))
    assert "percent-encode" in str(refused.value)
    assert_never_shown(str(refused.value), password)
    redacted = Dsn(uri(password, encode=False)).redact(f"host 'Ty5@127.0.0.1' {password}")
    assert "127.0.0.1" in redacted and "Ty5" not in redacted and "Er4" not in redacted


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # An unquoted space ends the value: libpq reads `Zw9@x` as a keyword without "=".
        ("host=127.0.0.1 user=intake password=Hq7 Zw9@x", 'missing "=" after'),
        ("host=127.0.0.1 user=intake password='Hq7@Zw9", "unterminated quoted string"),
        ("host=127.0.0.1 user=intake Hq7@Zw9=secret", "invalid connection option"),
        ("postgresql://intake@127.0.0.1/alerts?Hq7@Zw9=1", "invalid URI query parameter"),
    ],
)
def test_a_malformed_keyword_dsn_is_named_in_libpqs_words_without_its_text(
    text: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load(text)
    message = str(refused.value)
    assert message.startswith(f"config error: state.database ({ENV}): ")
    assert problem in message and "\n" not in message
    assert_never_shown(message, "Hq7@Zw9")


@pytest.mark.parametrize("port", ["Nm5", "0", "65536", "5432,Nm5"])
def test_a_port_that_is_not_a_number_is_refused_at_load_without_its_value(port: str) -> None:
    """libpq checks the port only at connect, and names its value: a password fragment when a
    `/` in the password ended the host part of the URI."""
    with pytest.raises(ConfigError) as refused:
        load(f"host=127.0.0.1,127.0.0.2 port={port} user=intake")
    assert "port" in str(refused.value) and "Nm5" not in str(refused.value)


def test_a_misread_dsn_in_the_database_file_names_the_file_key(tmp_path: Path) -> None:
    """The file twin: the error names `NTFY_INTAKE_STATE_DATABASE_FILE`, never the value."""
    secret = tmp_path / "dsn"
    secret.write_text(uri("S3%CRET", encode=False) + "\n")
    os.chmod(secret, 0o600)
    with pytest.raises(ConfigError) as refused:
        settings.load(None, {**BASE, f"{ENV}_FILE": str(secret)})
    assert str(refused.value).startswith(f"config error: state.database ({ENV}_FILE): ")
    assert_never_shown(str(refused.value), "S3%CRET")


@pytest.mark.parametrize("password", PASSWORDS)
def test_redaction_removes_the_password_in_every_form_libpq_could_print(password: str) -> None:
    dsn = Dsn(uri(password, encode=True))
    said = f'at "127.0.0.1": {password} / {quote(password, safe="")} / {quote(password)} for user intake'
    redacted = dsn.redact(said)
    assert_never_shown(redacted, password)
    assert "127.0.0.1" in redacted and "user intake" in redacted


def test_redaction_of_a_misread_uri_removes_what_follows_the_at_sign() -> None:
    dsn = Dsn(uri("Hq7@Zw9", encode=False))
    redacted = dsn.redact("failed to resolve host 'Zw9@127.0.0.1': Name or service not known")
    assert "Zw9" not in redacted and "127.0.0.1" in redacted and "resolve host" in redacted
    assert "Zw9" not in str(dsn) + repr(dsn)


@pytest.mark.parametrize("password", NAIVE_BROKEN)
def test_a_misread_dsn_at_connect_is_a_permanent_one_line_error_without_the_password(
    password: str,
) -> None:
    """A DSN that never went through config load (`store copy --to`, a drill) is checked at
    connect: exit 2, not libpq's misreading "unreachable" waited out for ever."""
    dsn = Dsn(uri(password, encode=False, port=closed_port()))
    with pytest.raises(StartupError) as refused:
        postgres.connect(dsn, timeout=2)
    assert str(refused.value).startswith("PostgreSQL DSN: ") and "\n" not in str(refused.value)
    assert "percent-encode" in str(refused.value)
    assert_never_shown(str(refused.value) + str(dsn) + repr(dsn), password)


@pytest.mark.parametrize(
    ("option", "problem"),
    [("sslmode=bogus", "invalid sslmode value"), ("keepalives=bogus", "invalid integer value")],
)
def test_an_option_libpq_refuses_only_at_connect_is_exit_2_not_unreachable(
    option: str, problem: str
) -> None:
    """Failure mode: libpq checks modes and numbers only when connecting; its refusal had no
    SQLSTATE and was taken for "unreachable", waited out for ever."""
    dsn = Dsn(f"host=127.0.0.1 port={closed_port()} user=intake password='Hq7@Zw9' {option}")
    with pytest.raises(db.ERRORS) as failed:
        postgres.connect(dsn, timeout=2)
    error = storage.startup_error(failed.value, dsn)
    assert isinstance(error, StartupError), error
    assert problem in str(error) and "malformed" in str(error) and "127.0.0.1" in str(error)
    assert_never_shown(str(error), "Hq7@Zw9")


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_real_connection_refused_is_waited_out_and_names_the_host_not_the_password(
    password: str,
) -> None:
    """A real OperationalError from libpq, a closed port, the password in the DSN."""
    port = closed_port()
    for text in (uri(password, encode=True, port=port), keywords(password, port=port)):
        dsn = Dsn(text)
        with pytest.raises(db.ERRORS) as failed:
            postgres.connect(dsn, timeout=2)
        error = storage.startup_error(failed.value, dsn)
        assert isinstance(error, DatabaseUnreachable), error
        assert f"127.0.0.1:{port}" in str(error) and "unreachable" in str(error)
        assert_never_shown(str(error), password)


def test_a_real_driver_error_quoting_a_misread_password_is_redacted_in_place() -> None:
    """dsn_rules.redact_exception on what libpq and psycopg really say when they misread a password
    into the host (the DSN handed to the driver directly, past every check): the same
    exception, class kept for classifying, its message without the password's pieces."""
    dsn = Dsn(uri("Hq7@Zw9", encode=False, port=closed_port()))
    with pytest.raises(psycopg.OperationalError) as failed:
        psycopg.connect(dsn.conninfo, connect_timeout=2)
    assert "Zw9@127.0.0.1" in str(failed.value)  # what the driver said carried it
    same = dsn_rules.redact_exception(failed.value, dsn.conninfo)
    assert same is failed.value and isinstance(same, psycopg.OperationalError)
    assert "resolve host" in str(same) and "127.0.0.1" in str(same)
    assert_never_shown(str(same), "Hq7@Zw9")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://u:p@[::1]:5/db", "postgresql://u@[::1]:5/db"),
        ("host=a,b port=1,2 user=u password=q dbname=alerts", "postgresql://u@a:1,b:2/alerts"),
        ("host=/run/postgresql dbname=intake", "postgresql:///run/postgresql/intake"),
    ],
)
def test_where_a_dsn_points_reads_right_even_with_a_one_letter_password(
    text: str, shown: str
) -> None:
    """Each part is redacted alone: a password `p` masked the scheme (`***ostgresql://`)."""
    assert str(Dsn(text)) == shown
