"""The house rules, read from the source: the product never imports its test bed (the one
exception is the CLI, which imports the test bed's commands lazily, inside the function that
builds its parser: testbed/commands.py), each room imports only the rooms below it, the pure rules do no I/O, only the store
speaks SQL, and no module has an import cycle. Imports inside functions count.
docs/architecture.md draws the rooms."""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "ntfy_intake"
TESTBED = "ntfy_intake.testbed"
TESTBED_TOOLS = ("emulator", "receiver", "signal_standin", "drill", "demo")
LAZY_DISPATCH = "ntfy_intake.cli"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, source: str | None = None) -> Iterator[tuple[str, bool]]:
    """(imported module, at module level?) for every import in the file, nested ones too.

    `from pkg import name` counts as importing `pkg.name` when that is a module, else `pkg`."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    top_level = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` blocks are module level too
        if isinstance(node, ast.If):
            top_level.update(id(child) for child in node.body)
    known = modules()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, id(node) in top_level
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in known else base), id(node) in top_level


def in_testbed(name: str) -> bool:
    return name == TESTBED or name.startswith(TESTBED + ".")


def test_the_test_bed_is_its_own_package_holding_every_tool() -> None:
    found = modules()
    for tool in TESTBED_TOOLS:
        assert f"{TESTBED}.{tool}" in found, f"{tool} is not in {TESTBED}"
        assert f"ntfy_intake.{tool}" not in found, f"{tool} still stands among the product"


def test_the_product_never_imports_its_test_bed() -> None:
    violations = []
    for name, path in modules().items():
        if in_testbed(name):
            continue
        for imported, top_level in imports(path):
            if not in_testbed(imported):
                continue
            if name == LAZY_DISPATCH and not top_level:
                continue  # the CLI runs a test-bed command by importing it when asked
            violations.append(f"{name} imports {imported}")
    assert violations == []


def test_the_direction_check_sees_imports_inside_functions() -> None:
    """The checker itself must catch a lazy import that is not the CLI's dispatch."""
    source = "import os\n\ndef f():\n    from ntfy_intake.testbed import drill\n"
    found = list(imports(PACKAGE / "surfaces" / "status.py", source))
    assert ("ntfy_intake.testbed", False) in found or ("ntfy_intake.testbed.drill", False) in found
    assert ("os", True) in found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_among_modules() -> None:
    found = modules()
    graph = {
        name: {imported for imported, _ in imports(path) if imported in found and imported != name}
        for name, path in found.items()
    }
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The rooms, lowest first: a module may import its own room and the rooms before it, never one
# after it. Top-level modules (the package itself, `errors`) are the floor; the CLI, which
# dispatches to everything, and the test bed, which proves everything, stand on top.
ROOMS = ("", "rules", "wire", "settings", "store", "flow", "surfaces", "runtime", "cli", "testbed")
FLOOR = ("ntfy_intake", "ntfy_intake.errors")
# The pure rules take plain values and a clock: none of these may be imported there.
IO_MODULES = (
    "asyncio",
    "socket",
    "ssl",
    "selectors",
    "sqlite3",
    "subprocess",
    "threading",
    "os",
    "shutil",
    "tempfile",
    "pathlib",
    "time",
    "urllib.request",
    "http",
    "httpx",
    "h11",
    "httpcore",
    "starlette",
    "uvicorn",
    "structlog",
    "logging",
    "prometheus_client",
)
SQL_DRIVERS = ("sqlite3", "psycopg", "psycopg_pool", "aiosqlite")


def room_of(name: str) -> str:
    if name in FLOOR:
        return ""
    if name in ("ntfy_intake.cli", "ntfy_intake.__main__"):
        return "cli"
    return name.split(".")[1]


def test_every_product_module_stands_in_a_room() -> None:
    stray = [name for name in modules() if room_of(name) not in ROOMS]
    assert stray == []


def test_each_room_imports_only_the_rooms_below_it() -> None:
    found = modules()
    violations = []
    for name, path in found.items():
        rank = ROOMS.index(room_of(name))
        for imported, top_level in imports(path):
            if imported not in found:
                continue
            if name == LAZY_DISPATCH and in_testbed(imported) and not top_level:
                continue  # the CLI's lazy dispatch to a test-bed command (checked above)
            if ROOMS.index(room_of(imported)) > rank:
                violations.append(f"{name} ({room_of(name)}) imports {imported}")
    assert violations == []


def test_the_pure_rules_import_no_io_module() -> None:
    violations = [
        f"{name} imports {imported}"
        for name, path in modules().items()
        if room_of(name) == "rules"
        for imported, _ in imports(path)
        if imported.split(".")[0] in IO_MODULES or imported in IO_MODULES
    ]
    assert violations == []


def test_only_the_store_imports_a_database_driver() -> None:
    speaking = {
        name
        for name, path in modules().items()
        if room_of(name) not in ("store", "testbed")
        for imported, _ in imports(path)
        if imported.split(".")[0] in SQL_DRIVERS
        # libpq's DSN parser, no SQL: config load reads `[state] database` with it (DESIGN.md
        # section 11), so the daemon connects with what it checked.
        and (name, imported) != ("ntfy_intake.settings.dsn", "psycopg.conninfo")
    }
    assert speaking == set()


def test_the_room_check_sees_an_upward_import() -> None:
    source = "def f():\n    from ntfy_intake.runtime import daemon\n"
    found = list(imports(PACKAGE / "rules" / "cadence.py", source))
    assert ("ntfy_intake.runtime.daemon", False) in found
    assert ROOMS.index(room_of("ntfy_intake.runtime.daemon")) > ROOMS.index("rules")


MAX_MODULE_LINES = 500


def code_lines(source: str) -> int:
    """The lines that hold code: not blank, not only a comment, not inside a docstring. The
    size rule counts these (issue 33): prose never pays for room, so nobody shortens a comment
    that says why to make a module fit."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    prose = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in prose or token.type == tokenize.ENDMARKER:
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_code_lines_leave_out_blank_lines_comments_and_docstrings() -> None:
    source = (
        '"""A module.\n\nIts doc."""\n'
        "\n"
        "# why the rule is what it is\n"
        "X = 1  # a trailing comment does not hide the code\n"
        "\n"
        "def f(a: int) -> str:\n"
        '    """What f does."""\n'
        "    text = (\n"
        '        "a string that is code"\n'
        "    )\n"
        "    return text\n"
    )
    assert code_lines(source) == 6


def test_no_product_module_is_over_500_lines() -> None:
    """Modules are nouns a newcomer can read whole (issue 22): past 500 lines of code (issue 33:
    code, not prose), split on a seam."""
    long = {
        name: lines
        for name, path in modules().items()
        if room_of(name) != "testbed" and (lines := code_lines(path.read_text())) > MAX_MODULE_LINES
    }
    assert long == {}


# Issue 33: the store reads and writes; the rules decide. No store module refers to an incident
# or event-cadence decision by name: `signal_of` and `merge` (rules/incidents.py), any `decide_*`
# and `reopen` (rules/cadence.py), the records they write (rules/cadence_records.py), or the fold
# of an event. The batch reaches them only through rules/batch_plan.py's Planner.
STORE_DECISIONS = frozenset(
    {"signal_of", "merge", "reopen", "apply_event", "event_record", "action_record"}
)
# The owner queue still decides owner messages in store (not the batch's; next to move).
STORE_DECISIONS_LEFT = {
    "ntfy_intake.store.owner_queue": {
        "decide_escalation",
        "decide_notice",
        "decide_owner_message",
        "owner_record",
    }
}


def store_decisions(name: str, source: str) -> set[str]:
    """The decision names a module refers to (an import, a name, an attribute), less the ones
    `STORE_DECISIONS_LEFT` grants it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
    decisions = {n for n in found if n in STORE_DECISIONS or n.startswith("decide_")}
    return decisions - STORE_DECISIONS_LEFT.get(name, set())


def test_no_store_module_calls_an_incident_or_cadence_decision() -> None:
    deciding = {
        name: sorted(names)
        for name, path in modules().items()
        if room_of(name) == "store" and (names := store_decisions(name, path.read_text()))
    }
    assert deciding == {}


def test_the_decision_check_sees_a_call_an_import_and_a_granted_name() -> None:
    source = (
        "from ntfy_intake.rules.incidents import signal_of\n"
        "def f(state, policy, view):\n"
        "    return state.decide_event(policy, view), signal_of(view)\n"
    )
    assert store_decisions("ntfy_intake.store.x", source) == {"decide_event", "signal_of"}
    granted = "def g(state):\n    return state.decide_notice()\n"
    assert store_decisions("ntfy_intake.store.owner_queue", granted) == set()
    assert store_decisions("ntfy_intake.store.x", granted) == {"decide_notice"}
