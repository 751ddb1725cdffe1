"""Only the store speaks SQL: no module outside store/ (and the test bed, which keeps databases
of its own) holds an SQL statement in a string literal. Issue 22; DESIGN.md section 9."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from .test_layout import modules, room_of

# Case-sensitive on purpose: SQL is written upper-case here, and prose says "select" and "update".
SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE TABLE|PRAGMA)\b")


def sql_strings(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """(line, text) of every string literal that holds an SQL statement; docstrings are prose."""
    tree = ast.parse(source, filename)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and SQL.search(node.value)
        ):
            yield node.lineno, node.value


def writers_of_sql() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, path in modules().items():
        if room_of(name) in ("store", "testbed"):
            continue
        hits = [
            f"{path.name}:{line}: {text[:60]!r}" for line, text in sql_strings(path.read_text())
        ]
        if hits:
            found[name] = hits
    return found


def test_no_module_outside_the_store_writes_sql() -> None:
    assert writers_of_sql() == {}


def test_the_sql_check_sees_a_statement_and_ignores_prose() -> None:
    source = (
        '"""Module docstring: SELECT is prose here."""\n'
        "def f(conn):\n"
        '    """SELECT in a docstring is prose too."""\n'
        "    label = 'select a channel, update the cursor'\n"
        '    return conn.execute(f"SELECT count(*) FROM {label}")\n'
        "PRAGMA = 'PRAGMA data_version'\n"
    )
    assert sorted(line for line, _ in sql_strings(source)) == [5, 6]
