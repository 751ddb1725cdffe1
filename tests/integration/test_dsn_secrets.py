"""A PostgreSQL password holding `%`, `@`, `:` or `/` never printed by `check`, `store copy` or
the daemon's log, and a DSN libpq would misread is exit 2 with one line naming the key (issue 32,
DESIGN.md section 11), against a real PostgreSQL that checks passwords.

The shared test cluster trusts every login, so a wrong password could not fail there: this
module starts its own throwaway cluster (initdb, scram-sha-256 on 127.0.0.1) in a temporary
directory, with one role per password, and stops it by its pid file at the end."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from ntfy_intake.store import db, migrations

from ..dsn_cases import NAIVE_BROKEN, PASSWORDS, assert_never_shown, closed_port

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Cluster:
    port: int
    socket_dir: str

    def role(self, password: str) -> str:
        return f"intake{PASSWORDS.index(password)}"

    def uri(self, password: str, *, encode: bool = True, database: str = "postgres") -> str:
        shown = quote(password, safe="") if encode else password
        return f"postgresql://{self.role(password)}:{shown}@127.0.0.1:{self.port}/{database}"

    def keywords(self, password: str, database: str = "postgres") -> str:
        escaped = password.replace("\\", "\\\\").replace("'", "\\'")
        return (
            f"host=127.0.0.1 port={self.port} user={self.role(password)} dbname={database}"
            f" password='{escaped}'"
        )


def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


def _run_as_owner(*args: str) -> None:
    # initdb and postgres refuse to run as root: as root, run them as the postgres user.
    command = ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else list(args)
    subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        reason = "PostgreSQL's initdb/pg_ctl are not installed: no password-checking cluster"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    home = Path(tempfile.mkdtemp(prefix="ntfy-intake-pwauth-"))
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
    data, port = home / "data", closed_port()
    pwfile = home / "pw"
    pwfile.write_text("superuser-not-used\n")
    if os.geteuid() == 0:
        shutil.chown(pwfile, "postgres")
    try:
        _run_as_owner(
            initdb,
            "-D",
            str(data),
            "-U",
            "postgres",
            "-N",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            f"--pwfile={pwfile}",
        )
        options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"
        _run_as_owner(
            pg_ctl, "-D", str(data), "-o", options, "-l", str(home / "log"), "-w", "start"
        )
        with psycopg.connect(host=str(home), port=port, user="postgres", autocommit=True) as su:
            for index, password in enumerate(PASSWORDS):
                role = f"intake{index}"
                su.execute(
                    psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        psycopg.sql.Identifier(role), psycopg.sql.Literal(password)
                    )
                )
                for database in (f"uri{index}", f"kw{index}"):
                    su.execute(
                        psycopg.sql.SQL("CREATE DATABASE {} OWNER {}").format(
                            psycopg.sql.Identifier(database), psycopg.sql.Identifier(role)
                        )
                    )
        yield Cluster(port, str(home))
    finally:
        _stop(data)
        shutil.rmtree(home, ignore_errors=True)


def _stop(data: Path) -> None:
    """The cluster's postmaster by the pid in its pid file (never by name)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGQUIT)  # immediate shutdown: a throwaway cluster
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.05)


def cli(
    *args: str, env: Mapping[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "ntfy_intake", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def config_file(tmp_path: Path, database: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(
        "[ntfy]\n"
        'url = "http://127.0.0.1:1"\n'
        'topics = ["alerts"]\n'
        "[state]\n"
        f"dir = {json.dumps(str(tmp_path / 'state'))}\n"
        f"database = {json.dumps(database)}\n"
    )
    path.chmod(0o600)
    return path


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, f"rc={done.returncode}: {done.stdout + done.stderr}"
    return lines[0]


@pytest.mark.parametrize("password", NAIVE_BROKEN)
@pytest.mark.parametrize("source", ["file", "database_file", "env"])
def test_check_refuses_a_misread_dsn_with_exit_2_one_line_naming_the_key(
    password: str, source: str, tmp_path: Path
) -> None:
    """Failure mode (issue 32): `check` (docker's health check) printed `invalid
    percent-encoded token: "S3%CRET"` and exited 1 (unhealthy, try again) for a DSN that can
    never work."""
    text = f"postgresql://intake:{password}@127.0.0.1:{closed_port()}/postgres"
    if source == "file":
        done = cli("check", "--config", str(config_file(tmp_path, text)), env={})
        key = "state.database: "
    elif source == "database_file":
        (tmp_path / "dsn").write_text(text + "\n")
        (tmp_path / "dsn").chmod(0o600)
        config = config_file(tmp_path, "unused")
        config.write_text(
            config.read_text().replace(
                'database = "unused"', f"database_file = {json.dumps(str(tmp_path / 'dsn'))}"
            )
        )
        done = cli("check", "--config", str(config), env={})
        key = "state.database (state.database_file): "
    else:
        env = {"NTFY_INTAKE_STATE_DIR": str(tmp_path), "NTFY_INTAKE_STATE_DATABASE": text}
        done = cli("check", env=env)
        key = "state.database (NTFY_INTAKE_STATE_DATABASE): "
    line = one_line(done)
    assert done.returncode == 2 and line.startswith(f"config error: {key}"), line
    assert "percent-encode" in line
    assert_never_shown(line, password)


@pytest.mark.parametrize("password", NAIVE_BROKEN)
@pytest.mark.parametrize("how", ["--to", "--to-file"])
def test_store_copy_refuses_a_misread_dsn_with_exit_2_one_line_naming_the_option(
    password: str, how: str, tmp_path: Path
) -> None:
    text = f"postgresql://intake:{password}@127.0.0.1:{closed_port()}/postgres"
    state = tmp_path / "state"
    state.mkdir()
    if how == "--to":
        target = text
    else:
        (tmp_path / "dsn").write_text(text + "\n")
        target = str(tmp_path / "dsn")
    done = cli("store", "copy", how, target, env={"NTFY_INTAKE_STATE_DIR": str(state)})
    line = one_line(done)
    assert done.returncode == 2 and line.startswith(f"config error: store copy {how}: "), line
    assert "percent-encode" in line
    assert_never_shown(line, password)


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("form", ["uri", "keywords"])
def test_a_wrong_password_is_refused_with_exit_2_naming_the_host_never_the_password(
    cluster: Cluster, password: str, form: str, tmp_path: Path
) -> None:
    """A real scram-sha-256 refusal: exit 2 (only a person can fix it), one line naming the
    server and the role, and neither the password given nor the right one."""
    wrong = password[::-1]
    role = cluster.role(password)
    if form == "uri":
        text = cluster.uri(password).replace(quote(password, safe=""), quote(wrong, safe=""))
    else:
        text = cluster.keywords(password).replace(f"'{password}'", f"'{wrong}'")
    config = str(config_file(tmp_path, text))
    for command in ("check", "status"):
        done = cli(command, "--config", config, env={})
        line = one_line(done)
        assert done.returncode == 2, line
        assert f"127.0.0.1:{cluster.port}" in line and "refused the login" in line
        assert f'"{role}"' in line  # libpq's own words reached the line: redaction ran on them
        assert_never_shown(line, password)
        assert_never_shown(line, wrong)


def sqlite_state(state: Path) -> None:
    state.mkdir()
    conn = db.connect(state / "intake.sqlite3")
    try:
        migrations.apply(conn)
    finally:
        conn.close()


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("form", ["uri", "keywords"])
def test_the_right_password_with_percent_at_colon_slash_logs_in_and_is_never_printed(
    cluster: Cluster, password: str, form: str, tmp_path: Path
) -> None:
    """libpq reads the password whole (the server accepts it), in both forms, and neither
    `store copy` nor `check` prints it afterwards."""
    index = PASSWORDS.index(password)
    database = f"uri{index}" if form == "uri" else f"kw{index}"
    text = (
        cluster.uri(password, database=database)
        if form == "uri"
        else cluster.keywords(password, database=database)
    )
    state = tmp_path / "state"
    sqlite_state(state)
    (tmp_path / "dsn").write_text(text + "\n")
    copied = cli(
        "store",
        "copy",
        "--to-file",
        str(tmp_path / "dsn"),
        env={"NTFY_INTAKE_STATE_DIR": str(state)},
    )
    said = copied.stdout + copied.stderr
    assert copied.returncode == 0, said
    where = f"postgresql://{cluster.role(password)}@127.0.0.1:{cluster.port}/{database}"
    assert f"into {where}" in said
    assert_never_shown(said, password)
    checked = cli("check", "--config", str(config_file(tmp_path, text)), env={})
    said = checked.stdout + checked.stderr
    assert "refused" not in said and "unreachable" not in said, said
    assert checked.returncode in (0, 1) and said.strip(), said  # unhealthy: no daemon ran
    assert_never_shown(said, password)


def run_daemon(
    env: Mapping[str, str], tmp_path: Path, *, until: str | None
) -> tuple[int | None, str]:
    """`ntfy-intake run` until it exits, or until its log holds `until` (bounded: 60 s); its
    exit code (None: still running, then stopped by its pid) and everything it logged."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    full.update(env)
    log = tmp_path / "daemon.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ntfy_intake", "run"], env=full, stdout=sink, stderr=sink
        )
        try:
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if until is not None and until in log.read_text():
                    break
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                rc = None
            else:
                rc = proc.returncode
    return rc, log.read_text()


def daemon_env(tmp_path: Path, database: str) -> dict[str, str]:
    return {
        "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:1",
        "NTFY_INTAKE_NTFY_TOPICS": "alerts",
        "NTFY_INTAKE_STATE_DIR": str(tmp_path / "state"),
        "NTFY_INTAKE_HTTP_LISTEN": "127.0.0.1:0",
        "NTFY_INTAKE_STATE_DATABASE": database,
    }


@pytest.mark.parametrize("password", NAIVE_BROKEN)
def test_the_daemon_exits_2_at_once_on_a_misread_dsn_never_waiting_it_out(
    password: str, tmp_path: Path
) -> None:
    """Failure mode (issue 32): the daemon logged the password and waited for ever for a
    server it could never reach."""
    text = f"postgresql://intake:{password}@127.0.0.1:{closed_port()}/postgres"
    rc, out = run_daemon(daemon_env(tmp_path, text), tmp_path, until=None)
    assert rc == 2, out
    assert "state.database (NTFY_INTAKE_STATE_DATABASE)" in out and "percent-encode" in out
    assert_never_shown(out, password)


@pytest.mark.parametrize("password", PASSWORDS)
def test_the_daemon_log_names_an_unreachable_server_never_the_password(
    password: str, tmp_path: Path
) -> None:
    """A well-written DSN to a closed port: the daemon waits the outage out and says so, by
    host and port, without the password in any form."""
    port = closed_port()
    text = f"postgresql://intake:{quote(password, safe='')}@127.0.0.1:{port}/postgres"
    rc, out = run_daemon(daemon_env(tmp_path, text), tmp_path, until="unreachable")
    assert rc is None, out  # still waiting the outage out: not an exit
    assert "unreachable" in out and f"127.0.0.1:{port}" in out, out
    assert_never_shown(out, password)
