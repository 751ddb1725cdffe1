"""The action buttons' key and used tokens (rules/action_tokens.py), as named SQL.

- `owner_action_key`: one row, the HMAC key every button token is signed with. It lives in the
  database, not in a file, so both nodes of a standby pair (one PostgreSQL database) verify the
  tokens either of them made. Made once by whoever needs it first (`signing_key`, given a fresh
  random candidate): a second node racing it keeps the row that won. Never audited, never
  logged, never read by status or metrics.
- `owner_action_uses`: each token used, by `rules.action_tokens.token_id`, inserted in the
  transaction of its effect (`claim`): a token pressed again finds its row and acts no more.
  Rows older than twice a token's life are dropped as new ones come (`claim`): a token that old
  is refused as expired before its row is looked for.
"""

from __future__ import annotations

from ntfy_intake.store.transaction import Connection

__all__ = ["claim", "settle", "signing_key", "used_result"]

_KEY = "SELECT secret FROM owner_action_key WHERE id = 1"
_MAKE_KEY = (
    "INSERT INTO owner_action_key(id, secret, created_at) VALUES (1, ?, ?)"
    " ON CONFLICT (id) DO NOTHING"
)
_CLAIM = (
    "INSERT INTO owner_action_uses(token_id, used_at, result) VALUES (?, ?, ?)"
    " ON CONFLICT (token_id) DO NOTHING"
)
_SETTLE = "UPDATE owner_action_uses SET result = ? WHERE token_id = ?"
_USED = "SELECT result FROM owner_action_uses WHERE token_id = ?"
_PRUNE = "DELETE FROM owner_action_uses WHERE used_at < ?"


def signing_key(conn: Connection, candidate: bytes, now: float) -> bytes:
    """The stored key, storing `candidate` first when there is none, in the caller's write
    transaction."""
    row = conn.execute(_KEY).fetchone()
    if row is None:
        conn.execute(_MAKE_KEY, (candidate.hex(), now))
        row = conn.execute(_KEY).fetchone()
    return bytes.fromhex(str(row[0]))


def claim(conn: Connection, token_id: str, now: float, forget_before: float) -> bool:
    """Record the token's use in the caller's write transaction; False when it was used
    before (its effect happened then)."""
    conn.execute(_PRUNE, (forget_before,))
    return conn.execute(_CLAIM, (token_id, now, "pending")).rowcount == 1


def settle(conn: Connection, token_id: str, result: str) -> None:
    """The claimed token's result, in the same transaction as its claim."""
    conn.execute(_SETTLE, (result, token_id))


def used_result(conn: Connection, token_id: str) -> str | None:
    """What the token's use did, when it was used."""
    row = conn.execute(_USED, (token_id,)).fetchone()
    return None if row is None else str(row[0])
