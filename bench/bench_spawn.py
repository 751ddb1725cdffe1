"""Spawn to subscribed: from starting `ntfy-intake run` until it has read ntfy's `open` frame.

Median of ROUNDS spawns against the emulator (empty topics, a fresh state directory each time),
bytecode compiled as in production. The clock stops when the daemon's `intake.connected` log line
appears (polled every 2 ms). References, same run: the interpreter alone (`python -c pass`) and
importing what `run` imports (`python -c "import ntfy_intake.runtime.daemon ..."`), so the rest is local
recovery, the HTTP surface and the connection. `--importtime` prints the slowest imports of a
real `run` (`python -X importtime`).

Run alone: uv run python bench/bench_spawn.py [--rounds 5] [--importtime]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _common import LogWatch, Row, bytecode_env, daemon, daemon_env, met, ratio, warm_bytecode
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

ROUNDS = 5
TARGET_S = 0.3
IMPORTS = "import ntfy_intake.cli, ntfy_intake.runtime.daemon, ntfy_intake.runtime.logs, ntfy_intake.settings"


@dataclass
class Spawn:
    subscribed_s: float
    interpreter_s: float
    imports_s: float


def _run(code: str) -> float:
    env = bytecode_env(dict(os.environ))
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.monotonic() - began


def spawn_to_subscribed(workdir: Path, rounds: int = ROUNDS) -> Spawn:
    warm_bytecode()
    times = []
    with NtfyEmulator(
        EmulatorConfig(keepalive_interval=1.0, manager_interval=None)
    ).running() as emu:
        for i in range(rounds):
            log = workdir / f"spawn-{i}.log"
            watch = LogWatch(log, b'"intake.connected"')
            env = daemon_env(emu.url, workdir / f"spawn-{i}")
            began = time.monotonic()
            with daemon(env, log) as proc:
                while not watch.seen():
                    if proc.poll() is not None or time.monotonic() - began > 30:
                        raise RuntimeError("daemon did not subscribe within 30 s")
                    time.sleep(0.002)
                times.append(time.monotonic() - began)
    interpreter = statistics.median(_run("pass") for _ in range(rounds))
    imports = statistics.median(_run(IMPORTS) for _ in range(rounds))
    return Spawn(statistics.median(times), interpreter, imports)


def rows(result: Spawn) -> list[Row]:
    return [
        Row(
            "spawn -> subscribed (median, bytecode compiled)",
            f"{result.subscribed_s * 1000:.0f} ms",
            f"python -c pass {result.interpreter_s * 1000:.0f} ms; "
            f"imports of `run` {result.imports_s * 1000:.0f} ms",
            ratio(result.subscribed_s, result.interpreter_s),
            f"<= {TARGET_S * 1000:.0f} ms",
            met(result.subscribed_s <= TARGET_S),
        )
    ]


def slowest_imports(limit: int = 15) -> str:
    """`python -X importtime` of the imports of `run`: the slowest, cumulative microseconds."""
    warm_bytecode()
    env = bytecode_env(dict(os.environ))
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", IMPORTS],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    entries = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            entries.append((int(parts[1]), parts[2].rstrip()))
    entries.sort(reverse=True)
    return "\n".join(f"{us / 1000:8.1f} ms {name}" for us, name in entries[:limit])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-spawn-", dir=args.dir) as tmp:
        for row in rows(spawn_to_subscribed(Path(tmp), args.rounds)):
            print(row)
    if args.importtime:
        print(slowest_imports())


if __name__ == "__main__":
    main()
