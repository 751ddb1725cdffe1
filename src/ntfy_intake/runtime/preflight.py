"""Start-up checks of the environment that no retry can fix: exit 2 with one line, not a traceback.

A state directory that is missing and cannot be created, is not a directory, or is not writable
by this user is a permanent cause (docs/design.md section 2): systemd's `RestartPreventExitStatus=2`
then stops a restart loop that cannot help. The line names the path, the user and what to do.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from ntfy_intake.errors import ConfigError

KEY = "state.dir"
_HINT = "set state.dir (NTFY_INTAKE_STATE_DIR) or fix the directory"


def check_state_dir(path: Path) -> None:
    """Create `path` (0700) when missing, then prove it is a directory this user can write.

    Raises ConfigError naming `state.dir` and the path; returns None when the directory is usable.
    """
    blocker = _file_in_the_way(path)
    if blocker is not None:
        where = "is a file" if blocker == path else f"is under a file ({blocker})"
        raise ConfigError(KEY, f"{path} {where}, not a directory: {_HINT}")
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        parent = _nearest_existing(path)
        raise ConfigError(
            KEY,
            f"cannot create {path}: {_cause(exc)} on {parent} as {_user()}; create it "
            f"(e.g. `install -d -m 700 -o {_user_name()} {path}`) or {_HINT}",
        ) from None
    _probe_writable(path)
    audit_dir = path / "audit"
    if audit_dir.exists() and not audit_dir.is_dir():
        raise ConfigError(KEY, f"{audit_dir} is not a directory: move it aside")
    if audit_dir.is_dir():
        _probe_writable(audit_dir)


def _probe_writable(directory: Path) -> None:
    # os.access() is not enough: root passes it on a read-only mount, ACLs and NFS disagree.
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".preflight-")
    except OSError as exc:
        raise ConfigError(
            KEY,
            f"{directory} is not writable: {_cause(exc)} as {_user()}{_owner(directory)}; "
            f"chown it to this user or {_HINT}",
        ) from None
    os.close(fd)
    os.unlink(name)


def _file_in_the_way(path: Path) -> Path | None:
    for candidate in (path, *path.parents):
        try:
            mode = candidate.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None  # unreadable: mkdir will say why
        return None if stat.S_ISDIR(mode) else candidate
    return None


def _nearest_existing(path: Path) -> Path:
    for candidate in path.parents:
        if candidate.exists():
            return candidate
    return Path("/")


def _cause(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    if exc.errno == errno.ENOSPC:
        return "no space left on device"
    return exc.strerror or type(exc).__name__


def _owner(directory: Path) -> str:
    try:
        info = directory.stat()
    except OSError:
        return ""
    return f" (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})"


def _user() -> str:
    return f"uid {os.geteuid()} ({_user_name()})"


def _user_name() -> str:
    try:
        import pwd  # noqa: PLC0415 - POSIX only

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())
