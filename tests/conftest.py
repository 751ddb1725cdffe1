"""Shared fixtures: an empty environment, a migrated store, message factories, child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

from ntfy_intake import cli
from ntfy_intake.rules import cadence
from ntfy_intake.store import db, migrations, postgres
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire.frames import Message, decode_line

from . import engines, harness
from .harness import Child
from .real_ntfy import RealNtfy

# The test process may open PostgreSQL at any point, and some tests name db.ERRORS before their
# first connection: load the driver as a daemon does at its first DSN (a no-op without it).
postgres.load_driver()

TOPICS = frozenset({"alerts", "backups"})


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("NTFY_INTAKE_", "NOTIFY_SOCKET", "WATCHDOG_")):
            monkeypatch.delenv(name, raising=False)


def pytest_configure(config: pytest.Config) -> None:
    """One throwaway PostgreSQL cluster for the whole run, however many xdist workers
    (tests/engines.py): the controller makes its directory, the workers are told where it is."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        engines.join_run(workerinput.get("ntfy_intake_pg_run", ""))
    else:
        engines.open_run()
        config.add_cleanup(engines.close_run)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): workers when the run spans a directory (the suite, a
    lane, `tests/integration`): two per core, up to 4, as most tests wait on sockets, daemons
    and PostgreSQL rather than on a core. None when it names only files or single tests: a
    worker costs seconds to start, more than a file's tests usually take. `-n N` or
    PYTEST_XDIST_AUTO_NUM_WORKERS choose otherwise; `-n0` runs in this process."""
    chosen = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if chosen:
        return int(chosen)
    named = [Path(arg.split("::", 1)[0]) for arg in config.args]
    if named and not any(path.is_dir() for path in named):
        return 0
    return min(4, 2 * len(os.sched_getaffinity(0)))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # pytest-xdist's, on the controller
    node.workerinput["ntfy_intake_pg_run"] = engines.run_dir()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Storage-touching tests run on both engines (tests/engines.py); a test about the wire or a
    surface whose store is incidental says `one_engine(reason)` and runs on SQLite only."""
    if "engine" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("sqlite_only"):
        return
    if metafunc.definition.get_closest_marker("one_engine"):
        return
    if metafunc.definition.get_closest_marker("engines") or "store" in metafunc.fixturenames:
        metafunc.parametrize("engine", engines.ENGINES, indirect=True)


# What makes a test slow, found in what it (or a fixture or helper of its module) calls: a whole
# daemon (in a thread or a process), a Python child (`sys.executable`: a second or so to
# import), or a browser. `-m "not slow"` (the fast lane) leaves these out; CI runs everything.
SLOW_CALLS = frozenset(
    {"DaemonThread", "daemon_process", "executable", "Daemon", "sync_playwright"}
)


def _names(code: types.CodeType, space: dict[str, object], seen: set[types.CodeType]) -> set[str]:
    """The global and attribute names `code` uses, through the functions of its module it calls."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const, space, seen)
    for name in list(names):
        target = space.get(name)
        if isinstance(target, types.FunctionType) and target.__code__ not in seen:
            seen.add(target.__code__)
            names |= _names(target.__code__, target.__globals__, seen)
    return names


def _starts_something_slow(item: pytest.Item) -> bool:
    functions = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info else None
        if defs:
            functions.append(defs[-1].func)
    seen: set[types.CodeType] = set()
    return any(
        isinstance(function, types.FunctionType)
        and bool(SLOW_CALLS & _names(function.__code__, function.__globals__, seen))
        for function in functions
    )


# Tests whose bounds are a few seconds while two daemons, an emulator and PostgreSQL run (the
# failovers and handovers), or that drive a whole drill: under pytest-xdist each group is one
# unit of work, run on one worker one test at a time, so at most one test of each group shares
# the cores with the lighter tests, never four handovers at once. First match of the path wins.
SERIAL_GROUPS = (
    ("tests/integration/two_nodes/test_handover_bounds.py", "handovers"),
    ("tests/integration/two_nodes/test_yield.py", "handovers"),
    ("tests/integration/two_nodes/test_standby.py", "handovers"),
    ("tests/integration/two_nodes/", "two_nodes"),
    ("tests/drills/test_drill_standby", "two_nodes"),
    ("tests/drills/", "drills"),
    ("tests/integration/test_storage_faults.py::test_storage_drill", "drills"),
    ("tests/integration/test_surface_limits.py::test_slow_connection_flood", "drills"),
)


def serial_group(nodeid: str) -> str | None:
    return next((name for prefix, name in SERIAL_GROUPS if nodeid.startswith(prefix)), None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` by SERIAL_GROUPS: xdist's own reads `xdist_group` marks from a node
    id suffix that pytest 9 no longer lets a plugin set, so it would group nothing."""
    if config.getoption("dist") != "loadgroup":
        return None
    return _PathGroups(config, log)


class _PathGroups(LoadGroupScheduling):  # type: ignore[misc]
    def _split_scope(self, nodeid: str) -> str:
        return serial_group(nodeid) or nodeid


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the long serial groups start first, not last
        items.sort(key=lambda item: serial_group(item.nodeid) is None)
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("engine") == "postgresql":
            item.add_marker(pytest.mark.postgresql)
        if item.get_closest_marker("soak") or (
            not item.get_closest_marker("slow") and _starts_something_slow(item)
        ):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def engine(request: pytest.FixtureRequest, _clean_environment: None) -> Iterator[str]:
    """The engine this test runs on; on PostgreSQL, a schema of its own (tests/engines.py)."""
    name: str = getattr(request, "param", "sqlite")
    if name == "sqlite":
        yield name
        return
    server = engines.server_dsn()
    if server is None:
        if os.environ.get("CI") == "true":
            pytest.fail(engines.unavailable())
        pytest.skip(engines.unavailable())
    schema, dsn = engines.create_schema(server)
    harness.DATABASE = dsn
    try:
        yield name
    finally:
        harness.DATABASE = None
        engines.drop_schema(server, schema)


@pytest.fixture
def store(tmp_path: Path, engine: str) -> Iterator[db.Connection]:
    conn = db.connect(engines.target(tmp_path, harness.DATABASE))
    migrations.apply(conn)
    yield conn
    conn.close()


@pytest.fixture
def emulator_config(request: pytest.FixtureRequest) -> EmulatorConfig:
    """The `emu` fixture's config: a 1 s keepalive unless the test or its module says
    `@pytest.mark.emulator(**EmulatorConfig fields)`; a module whose config needs another
    fixture (a clock it moves) overrides this fixture instead."""
    marker = request.node.get_closest_marker("emulator")
    options: dict[str, object] = {"keepalive_interval": 1.0, **(marker.kwargs if marker else {})}
    return EmulatorConfig(**options)  # type: ignore[arg-type]


@pytest.fixture
def emu(emulator_config: EmulatorConfig) -> Iterator[NtfyEmulator]:
    """The bundled ntfy-compatible server on 127.0.0.1, stopped after the test."""
    with NtfyEmulator(emulator_config).running() as emulator:
        yield emulator


def make_message(
    event_id: str,
    *,
    time: int = 1_764_470_000,
    topic: str = "alerts",
    title: str | None = "Disk full",
    message: str = "sda1 at 97%",
    priority: int | None = None,
    cached: bool = True,
) -> Message:
    obj: dict[str, object] = {"id": event_id, "time": time, "event": "message", "topic": topic}
    if cached:
        obj["expires"] = time + 43200
    if title is not None:
        obj["title"] = title
    obj["message"] = message
    if priority is not None:
        obj["priority"] = priority
    frame = decode_line(json.dumps(obj).encode(), TOPICS)
    assert isinstance(frame, Message), frame
    return frame


def owner_queue(**policy: object) -> OwnerQueue:
    """A fresh cadence state; tests default to no debounce so requests release at once."""
    settings = {"debounce": 0.0, **policy}
    chosen = cadence.Policy(**settings)  # type: ignore[arg-type]
    return OwnerQueue(chosen, cadence.CadenceState.empty(chosen))


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Child]]:
    children: list[Child] = []

    def start(code: str, *args: object) -> Child:
        stderr_path = tmp_path / f"child-{len(children)}.stderr"
        with stderr_path.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-c", code, *map(str, args)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        children.append(Child(proc, stderr_path))
        return children[-1]

    yield start
    for child in children:  # killed by pid, whatever the test did
        child.kill()


CliRun = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def cli_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> CliRun:
    """cli_in_process(*args, env={...}) -> `ntfy-intake ARGS` run in this process, for checks
    that end before any daemon, server or store would start (bad arguments, bad settings,
    --help): a child would spend a second importing to say one line. The exit code, stdout and
    stderr come back as a subprocess's would; the signal handlers `run` installs first are put
    back."""

    def run(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        capsys.readouterr()
        with monkeypatch.context() as scoped:
            for name, value in (env or {}).items():
                scoped.setenv(name, value)
            try:
                code: object = cli.main(list(args))
            except SystemExit as exc:  # argparse: --help exits 0, a usage error 2
                code = exc.code
            finally:
                for sig, handler in saved.items():
                    signal.signal(sig, handler)
        out, err = capsys.readouterr()
        returncode = code if isinstance(code, int) else (0 if code is None else 1)
        return subprocess.CompletedProcess(["ntfy-intake", *args], returncode, out, err)

    return run


@pytest.fixture
def make_real_ntfy(tmp_path: Path) -> Iterator[Callable[..., RealNtfy]]:
    """make_real_ntfy(auth=..., cache_duration=..., ...) -> a started RealNtfy; stopped by pid."""
    servers: list[RealNtfy] = []

    def make(**options: object) -> RealNtfy:
        server = RealNtfy(tmp_path / f"ntfy-{len(servers)}", **options)  # type: ignore[arg-type]
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.stop()
