"""A full disk on demand, for the drills: a small tmpfs over a directory, and a filler.

Shared by the storage drill (`drill --faults storage`) and the standby drill's audit-full
fault (`drill --standby`); apart from both so neither drill imports the other.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_filesystem(directory: Path, size: str) -> Iterator[str | None]:
    """Mount a tmpfs at `directory`; yields None when mounted, else why not. Always unmounted."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory)]
        done = subprocess.run(  # noqa: S603 - mount(8) on the drill's own temp dir
            mount, capture_output=True, text=True, check=False
        )
    except OSError as exc:
        yield f"cannot run mount: {exc.strerror or exc}"
        return
    if done.returncode != 0:
        yield f"mount refused: {done.stderr.strip() or f'exit {done.returncode}'}"
        return
    try:
        yield None
    finally:
        subprocess.run(  # noqa: S603 - the mount made above, by its path
            ["umount", "-l", str(directory)],  # noqa: S607
            check=False,
            capture_output=True,
        )


def fill(path: Path) -> int:
    """Write zeros to `path` until the filesystem is full; return the bytes written."""
    written = 0
    chunk = 1 << 20
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while chunk >= 512:
            try:
                written += os.write(fd, b"\0" * chunk)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                chunk //= 4
    finally:
        os.close(fd)
    return written
