"""Start and stop a server binary the tests run for real (the Go builds of ntfy and
Alertmanager): its output appended to a log file, ready once a URL answers 200, stopped by pid
(SIGTERM with a bounded wait, then SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

LOG_TAIL = 3000  # characters of the log an error quotes


def log_tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-LOG_TAIL:] if log_path.exists() else ""


def start(
    argv: Sequence[str], log_path: Path, ready_url: str, *, name: str, timeout: float
) -> subprocess.Popen[bytes]:
    """Spawn `argv` and wait until `ready_url` answers 200; RuntimeError (with the log's tail)
    when it exits first or does not answer within `timeout` (it is stopped then)."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at start:\n{log_tail(log_path)}")
        try:
            if httpx.get(ready_url, timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop(proc, 5.0)
            raise RuntimeError(f"{name} did not answer:\n{log_tail(log_path)}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout` s; nothing when it is not running."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill9(proc)


def kill9(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
