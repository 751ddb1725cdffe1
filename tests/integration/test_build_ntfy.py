"""scripts/build-ntfy's mechanics, on a stand-in module served from a local file proxy.

The stand-in is NOT ntfy: it is a tiny cgo program published under ntfy's module path and version
so that the script's steps can be exercised where the real module cannot be fetched: download by
`go mod download -json`, a writable copy (the module has a replace directive, which `go install`
would refuse), the two placeholder files ntfy's Makefile creates (the stand-in embeds them, so a
missing one fails the build), a cgo build, the cache keyed by version, and exit 3 with the reason
when the module or the toolchain cannot be had.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-ntfy"
VERSION = (ROOT / "scripts" / "ntfy-version").read_text().strip()
MODULE = "heckel.io/ntfy/v2"

GO_MOD = f"""module {MODULE}

go 1.21

replace example.com/unused => example.com/unused v0.0.0
"""
MAIN_GO = """package main

// #include <stdio.h>
import "C"

import (
	_ "embed"
	"fmt"
)

//go:embed server/site/app.html
var app string

//go:embed server/docs/index.html
var docs string

func main() { fmt.Println("stand-in serve --help", len(app) > 0, len(docs) > 0) }
"""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("go") is None, reason="needs the Go toolchain"),
]


def _file_proxy(root: Path) -> Path:
    versions = root / MODULE / "@v"
    versions.mkdir(parents=True)
    (versions / "list").write_text(f"{VERSION}\n")
    (versions / f"{VERSION}.info").write_text(
        f'{{"Version":"{VERSION}","Time":"2026-01-01T00:00:00Z"}}'
    )
    (versions / f"{VERSION}.mod").write_text(GO_MOD)
    with zipfile.ZipFile(versions / f"{VERSION}.zip", "w") as archive:
        prefix = f"{MODULE}@{VERSION}/"
        archive.writestr(prefix + "go.mod", GO_MOD)
        archive.writestr(prefix + "main.go", MAIN_GO)
    return root


def _make_writable(path: Path) -> None:
    for dirpath, _, _ in os.walk(path):
        Path(dirpath).chmod(stat.S_IRWXU)


@pytest.fixture
def go_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    proxy = _file_proxy(tmp_path / "proxy")
    env = {
        **os.environ,
        "GOPROXY": f"file://{proxy}",
        "GONOSUMDB": "*",
        "GONOSUMCHECK": "1",
        "GOSUMDB": "off",
        "GOMODCACHE": str(tmp_path / "modcache"),
        "NTFY_CACHE_DIR": str(tmp_path / "cache"),
    }
    yield env
    if (tmp_path / "modcache").exists():
        _make_writable(tmp_path / "modcache")


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_builds_from_the_module_with_placeholders_and_reuses_the_cache(
    go_env: dict[str, str], tmp_path: Path
) -> None:
    built = run(go_env)
    assert built.returncode == 0, built.stderr
    binary = Path(built.stdout.strip())
    assert binary == tmp_path / "cache" / f"ntfy-{VERSION}" / "ntfy"
    assert "(cold)" in built.stderr
    shown = subprocess.run([binary], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "stand-in serve --help true true"
    again = run(go_env)
    assert again.returncode == 0 and Path(again.stdout.strip()) == binary
    assert "cached" in again.stderr


def test_a_module_the_proxy_refuses_exits_3_with_the_reason(
    go_env: dict[str, str], tmp_path: Path
) -> None:
    shutil.rmtree(tmp_path / "proxy" / MODULE)
    refused = run(go_env)
    assert refused.returncode == 3
    reason = (tmp_path / "cache" / f"ntfy-{VERSION}" / "unavailable.txt").read_text()
    assert f"go mod download {MODULE}@{VERSION} failed" in reason
    assert reason.strip() in refused.stderr


def test_no_go_toolchain_exits_3_with_the_reason(go_env: dict[str, str]) -> None:
    env = {**go_env, "PATH": "/usr/bin:/bin"}
    if shutil.which("go", path=env["PATH"]):
        pytest.skip("a go binary is on the minimal PATH")
    refused = run(env)
    assert refused.returncode == 3
    assert "no Go toolchain" in refused.stderr


def test_a_compile_error_is_not_unavailability(go_env: dict[str, str], tmp_path: Path) -> None:
    broken = tmp_path / "proxy" / MODULE / "@v" / f"{VERSION}.zip"
    with zipfile.ZipFile(broken, "w") as archive:
        prefix = f"{MODULE}@{VERSION}/"
        archive.writestr(prefix + "go.mod", GO_MOD)
        archive.writestr(prefix + "main.go", "package main\nfunc main() { undefined() }\n")
    failed = run(go_env)
    assert failed.returncode not in (0, 3)
