"""compose.demo.yaml, statically: every demo service is the ntfy-intake image running one of its
own subcommands, wired to what deploy/compose.config.toml expects. `.ci/docker-check` runs the
stack; these checks need no engine. PyPI's pyyaml and yamllint make them run (dev dependencies);
without them they skip with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ntfy_intake import cli, settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DEMO = ROOT / "compose.demo.yaml"
COMPOSE_CONFIG = ROOT / "deploy" / "compose.config.toml"


def load(path: Path) -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def demo() -> dict[str, Any]:
    return load(DEMO)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load(COMPOSE)


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_demo_services_are_the_intake_image_running_its_own_subcommands(
    demo: dict[str, Any], compose: dict[str, Any]
) -> None:
    image = compose["services"]["ntfy-intake"]["image"]
    expected = {"ntfy": "emulator", "signal-cli-rest-api": "signal-standin", "triage": "receiver"}
    for name, subcommand in expected.items():
        service = demo["services"][name]
        assert service["image"] == image, name
        assert service["build"] == ".", f"{name}: `up --build` must be able to make the image"
        assert service["command"][0] == subcommand
        cli._parser().parse_args(service["command"])  # a typo'd flag exits 2 here
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
    # The overrides publish nothing beyond what compose.yaml already publishes.
    assert all("ports" not in service for service in demo["services"].values())


def test_demo_servers_listen_where_the_daemon_looks(demo: dict[str, Any]) -> None:
    config = tomllib.loads(COMPOSE_CONFIG.read_text())
    services = demo["services"]
    ntfy, signal = services["ntfy"]["command"], services["signal-cli-rest-api"]["command"]
    assert option(ntfy, "--port") == str(urlsplit(config["ntfy"]["url"]).port)
    assert option(ntfy, "--keepalive") == config["ntfy"]["keepalive_interval"]
    assert option(ntfy, "--cache-duration") == config["ntfy"]["cache_duration"]
    assert option(signal, "--port") == str(urlsplit(config["owner"]["signal_url"]).port)
    for command in (ntfy, signal, services["triage"]["command"]):
        assert option(command, "--host") == "0.0.0.0"  # inside the compose network
    relay = urlsplit(services["ntfy-intake"]["environment"]["NTFY_INTAKE_RELAY_URL"])
    assert relay.hostname == "triage"
    assert str(relay.port) == option(services["triage"]["command"], "--port")
    assert option(services["triage"]["command"], "--db").startswith("/data/")
    assert "triage" in services["ntfy-intake"]["depends_on"]


def test_demo_needs_no_secrets_and_the_daemon_accepts_its_config(
    demo: dict[str, Any], compose: dict[str, Any]
) -> None:
    intake = demo["services"]["ntfy-intake"]["environment"]
    # Every token file compose.yaml passes is switched off (empty = not set).
    for name in compose["services"]["ntfy-intake"]["environment"]:
        assert intake[name] == "", name
    assert {s: v["file"] for s, v in demo["secrets"].items()} == {
        name: "/dev/null" for name in compose["secrets"]
    }
    loaded = settings.load(
        COMPOSE_CONFIG,
        {
            **{k: str(v) for k, v in intake.items()},
            "NTFY_INTAKE_STATE_DIR": "/data",  # the image's ENV
        },
    )
    assert loaded.relay.url == intake["NTFY_INTAKE_RELAY_URL"]
    assert loaded.ntfy.token is None
    assert loaded.cadence.debounce == 5.0


def test_yamllint_demo() -> None:
    tool = shutil.which("yamllint")
    if tool is None:
        pytest.skip("yamllint is not installed (PyPI or Debian: yamllint)")
    rules = "{extends: default, rules: {line-length: {max: 120}, document-start: disable}}"
    result = subprocess.run(
        [tool, "--strict", "-d", rules, str(DEMO)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
