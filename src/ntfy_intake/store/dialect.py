"""Where the two engines' SQL differs, a store module names both statements and picks one here.

Only what really differs is written twice (scalar `max(a, b)` is PostgreSQL's `GREATEST`,
`json_each` its `json_array_elements_text`); what both read alike is written once in the form
both read (`ON CONFLICT DO NOTHING` for `INSERT OR IGNORE`, `CASE` for a scalar `max(a, b)`);
placeholders are the same text on both (postgres.translate rewrites them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ntfy_intake.store import postgres
from ntfy_intake.store.transaction import Connection


def is_postgres(conn: Connection) -> bool:
    return isinstance(conn, postgres.PgConnection)


def pick(conn: Connection, *, sqlite: str, postgresql: str) -> str:
    return postgresql if isinstance(conn, postgres.PgConnection) else sqlite


def one_of(conn: Connection, column: str, values: Sequence[str]) -> tuple[str, object]:
    """`column` is one of `values`, as a condition on ONE parameter, and that parameter: a
    text array for PostgreSQL's `= ANY`, a JSON array for SQLite's `json_each`."""
    if isinstance(conn, postgres.PgConnection):
        return f"{column} = ANY(?)", list(values)
    return f"{column} IN (SELECT value FROM json_each(?))", json.dumps(list(values))
