"""scripts/build-alertmanager: the real Alertmanager from its Go module, cached by version, and
exit 3 with a reason file when Go or the module cannot be had (the tests then skip naming it).

Timed on this 2-core machine: 248 s fully cold (empty module and build caches, the proxy
download included), 170 s with the module cached, 5 s with a warm Go build cache, and a cached
binary returns in under 0.1 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-alertmanager"
VERSION = (ROOT / "scripts" / "alertmanager-version").read_text().strip()

pytestmark = pytest.mark.slow


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT)], capture_output=True, text=True, timeout=900, env=env, check=False
    )


@pytest.mark.skipif(shutil.which("go") is None, reason="needs the Go toolchain")
def test_builds_or_reuses_the_pinned_version() -> None:
    done = _run(dict(os.environ))
    assert done.returncode == 0, done.stderr
    binary = Path(done.stdout.strip())
    assert binary.parent.name == f"alertmanager-{VERSION}"
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True)
    assert f"version {VERSION.removeprefix('v')}" in version.stdout + version.stderr
    again = _run(dict(os.environ))
    assert (again.returncode, again.stdout) == (0, done.stdout)
    assert "cached" in again.stderr


def test_no_go_toolchain_exits_3_with_the_reason(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "dirname", "tr", "mkdir"):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)
    env = {"PATH": str(tools), "HOME": str(tmp_path), "NTFY_CACHE_DIR": str(tmp_path / "cache")}
    done = _run(env)
    assert done.returncode == 3, done.stderr
    reason = (tmp_path / "cache" / f"alertmanager-{VERSION}" / "unavailable.txt").read_text()
    assert reason.startswith("no Go toolchain on PATH")
    assert done.stderr.strip().endswith(reason.strip())


@pytest.mark.skipif(shutil.which("go") is None, reason="needs the Go toolchain")
def test_a_module_that_cannot_be_fetched_exits_3_with_the_reason(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "NTFY_CACHE_DIR": str(tmp_path / "cache"),
        "GOMODCACHE": str(tmp_path / "mod"),
        "GOPROXY": "off",
    }
    done = _run(env)
    assert done.returncode == 3, done.stderr
    reason = (tmp_path / "cache" / f"alertmanager-{VERSION}" / "unavailable.txt").read_text()
    assert f"go mod download github.com/prometheus/alertmanager@{VERSION} failed" in reason
