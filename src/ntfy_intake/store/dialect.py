"""Where the two engines' SQL differs, a store module names both statements and picks one here.

Only what really differs is written twice (scalar `max(a, b)` is PostgreSQL's `GREATEST`,
`json_each` its `json_array_elements_text`); what both read alike is written once in the form
both read (`ON CONFLICT DO NOTHING` for `INSERT OR IGNORE`, `CASE` for a scalar `max(a, b)`);
placeholders are the same text on both (postgres.translate rewrites them).
"""

from __future__ import annotations

from collections.abc import Sequence

from ntfy_intake.store import postgres
from ntfy_intake.store.transaction import Connection


def is_postgres(conn: Connection) -> bool:
    return isinstance(conn, postgres.PgConnection)


def pick(conn: Connection, *, sqlite: str, postgresql: str) -> str:
    return postgresql if isinstance(conn, postgres.PgConnection) else sqlite


def one_of(
    conn: Connection, column: str, values: Sequence[str]
) -> list[tuple[str, Sequence[object]]]:
    """`column` is one of `values`: the conditions, each with its parameters, that together
    name them all (none for no values). PostgreSQL: one condition, the values ONE array parameter (`= ANY`), so its
    text is the same for any number of them (psycopg caches no statement text over 4 KB, and the
    server plans each text anew). SQLite: a placeholder per value, at most 500 per condition
    (its statements are cheap to parse; a JSON array for json_each would cut a value at a NUL)."""
    if not values:
        return []  # nothing to name: no statement at all
    if isinstance(conn, postgres.PgConnection):
        return [(f"{column} = ANY(?)", (list(values),))]
    chunks = [values[start : start + 500] for start in range(0, len(values), 500)]
    return [(f"{column} IN ({','.join('?' * len(chunk))})", tuple(chunk)) for chunk in chunks]


def stored_text(conn: Connection, value: str) -> str:
    """`value` as the engine stores and answers it (PostgreSQL: NUL as U+FFFD, postgres._text)."""
    return postgres.stored_text(value) if isinstance(conn, postgres.PgConnection) else value
