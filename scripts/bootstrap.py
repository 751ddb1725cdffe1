#!/usr/bin/env python3
"""Run a pinned uv with nothing but the system python3: `python3 scripts/bootstrap.py <uv args>`.

Why: Debian 12 and Raspberry Pi OS mark their python3 "externally managed" (PEP 668), and a
minimal install has neither pip nor venv's ensurepip, so `pip install uv` is refused there. This
script needs only the standard library: it downloads the uv wheel for this platform from PyPI,
checks its sha256 against the digest PyPI lists *and* against the digest pinned below (a wheel
that does not match both is refused), unpacks the `uv` binary into a cache directory
(`$XDG_CACHE_HOME/ntfy-intake/uv-<version>/`, default `~/.cache/...`), and execs it with the
arguments given. uv then builds the project's `.venv` itself (it needs neither pip nor venv).

uv is told to use the Python running this script (`UV_PYTHON`) and never to download one
(`UV_PYTHON_DOWNLOADS=never`) when that Python is recent enough; both can be overridden from
the environment.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import stat
import struct
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile

UV_VERSION = "0.13.9"
MIN_PYTHON = (3, 11)  # pyproject's requires-python
INDEX = os.environ.get("NTFY_INTAKE_BOOTSTRAP_INDEX", "https://pypi.org/pypi")
TIMEOUT_S = 60

# (system, machine) -> (wheel file name, sha256). Update all of them with UV_VERSION.
WHEELS = {
    ("linux", "x86_64"): (
        "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
    ),
    ("linux", "aarch64"): (  # Raspberry Pi OS 64-bit, Pi 4/5
        "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
        "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
    ),
    ("linux", "armv7l"): (  # Raspberry Pi OS 32-bit
        "uv-0.13.9-py3-none-manylinux_2_17_armv7l.manylinux2014_armv7l.whl",
        "16963d19594e18d746a70c7fce82237bde4f2cac4cfcf0ca2b84796fe9d0c6e9",
    ),
    ("linux", "armv6l"): (  # Pi Zero / Pi 1
        "uv-0.13.9-py3-none-linux_armv6l.whl",
        "56ec37616c00220032fc7b8c9d0ef51367fd0d70d9cd6ddd841660f949f84fed",
    ),
    ("darwin", "x86_64"): (
        "uv-0.13.9-py3-none-macosx_10_12_x86_64.whl",
        "c16ed11e013557536b3e60065f1b912f6407bd6518e041b961e23ef9e6b4fbf5",
    ),
    ("darwin", "arm64"): (
        "uv-0.13.9-py3-none-macosx_11_0_arm64.whl",
        "66c512266d633bef48384a1f53003f41f2a8e7b36fe6e7fbfd3e0fd52d96fa63",
    ),
}


class BootstrapError(Exception):
    """One line for the user; no traceback."""


def platform_key() -> tuple[str, str]:
    system = platform.system().lower()
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
        machine, machine
    )
    # A 32-bit userland on a 64-bit kernel (older Raspberry Pi OS images) reports aarch64.
    if system == "linux" and machine == "aarch64" and struct.calcsize("P") == 4:
        machine = "armv7l"
    return system, machine


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ntfy-intake", "uv-" + UV_VERSION)


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 - https URL
            return bytes(response.read())
    except (urllib.error.URLError, OSError) as exc:
        raise BootstrapError(f"cannot download {url}: {exc}") from exc


def pypi_files(version: str) -> tuple[str, list[dict[str, object]]]:
    """The release's files from PyPI's JSON API: (base URL for relative links, files)."""
    url = f"{INDEX}/uv/{version}/json"
    try:
        return url, list(json.loads(_get(url))["urls"])
    except (BootstrapError, KeyError, ValueError):
        # Some mirrors serve only the project-wide document; its "releases" has every version.
        url = f"{INDEX}/uv/json"
        try:
            return url, list(json.loads(_get(url))["releases"][version])
        except (KeyError, ValueError) as exc:
            raise BootstrapError(f"{url} lists no uv {version}") from exc


def verified_wheel(filename: str, pinned_sha256: str) -> bytes:
    base, files = pypi_files(UV_VERSION)
    entry = next((f for f in files if f.get("filename") == filename), None)
    if entry is None:
        raise BootstrapError(f"PyPI does not list {filename}")
    listed = str(entry.get("digests", {}).get("sha256", ""))  # type: ignore[union-attr]
    if listed != pinned_sha256:
        raise BootstrapError(
            f"PyPI lists sha256 {listed or 'none'} for {filename}, this script pins {pinned_sha256}"
        )
    data = _get(urllib.parse.urljoin(base, str(entry["url"])))
    actual = hashlib.sha256(data).hexdigest()
    if actual != pinned_sha256:
        raise BootstrapError(f"downloaded {filename} has sha256 {actual}, expected {pinned_sha256}")
    return data


def install_uv() -> str:
    """Path of the pinned uv binary, downloading and verifying it on first use."""
    target = os.path.join(cache_dir(), "uv")
    if os.access(target, os.X_OK):
        return target
    key = platform_key()
    if key not in WHEELS:
        raise BootstrapError(
            f"no pinned uv wheel for {key[0]}/{key[1]}; install uv {UV_VERSION} yourself "
            "(https://docs.astral.sh/uv/) and run `uv run ...` instead"
        )
    filename, sha256 = WHEELS[key]
    print(f"bootstrap: fetching uv {UV_VERSION} ({filename}), sha256 pinned", file=sys.stderr)
    data = verified_wheel(filename, sha256)
    member = f"uv-{UV_VERSION}.data/scripts/uv"
    try:
        binary = zipfile.ZipFile(io.BytesIO(data)).read(member)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise BootstrapError(f"{filename} has no {member}") from exc
    os.makedirs(cache_dir(), exist_ok=True)
    # Write beside the target and rename: a second bootstrap running at once never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), prefix=".uv-")
    with os.fdopen(fd, "wb") as out:
        out.write(binary)
    os.chmod(tmp, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    os.replace(tmp, target)
    return target


def uv_environ(environ: dict[str, str]) -> dict[str, str]:
    env = dict(environ)
    if sys.version_info >= MIN_PYTHON:
        env.setdefault("UV_PYTHON", sys.executable)
        env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    return env


def main(argv: list[str]) -> int:
    if not argv:
        print(
            f"usage: python3 {sys.argv[0]} <uv arguments>  (e.g. run ntfy-intake demo)",
            file=sys.stderr,
        )
        return 2
    try:
        uv = install_uv()
    except BootstrapError as exc:
        print(f"bootstrap: {exc}", file=sys.stderr)
        return 2
    env = uv_environ(dict(os.environ))
    if os.name == "nt":  # no exec on Windows: wait for the child instead
        import subprocess  # noqa: PLC0415

        return subprocess.call([uv, *argv], env=env)  # noqa: S603
    os.execve(uv, [uv, *argv], env)  # noqa: S606
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
