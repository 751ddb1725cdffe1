"""Owner notices a standby owes (DESIGN.md section 11): a standby cannot write the outbox, so
what it must tell the owner (a burst of wrong tokens against its HTTP surface: the same
`http.token` opens the leader) goes on its own node row (store/nodes.owe), and the leader's
prober records it through its journal, by the notice's key (once: the outbox's key makes a
repeat a no-op), then clears it (store/nodes.settle).

Invariants owned here:
- a notice is owed by the instance that held the guard (only its own row is written), and a
  write that fails is logged, never raised into a request (the hold itself stands either way);
- the leader clears only the keys it recorded: a notice owed meanwhile waits for the next probe.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from ntfy_intake.rules.notices import Notice
from ntfy_intake.settings.schema import Dsn
from ntfy_intake.store import db, nodes, postgres

log = structlog.get_logger("ntfy_intake.owed")


class Owing(Protocol):
    """What of this node's cluster member the owing needs (runtime/cluster.Member)."""

    dsn: Dsn
    node: str
    instance: str
    renew_every: float


def as_json(notice: Notice) -> dict[str, Any]:
    return {"notice": notice.notice, "text": notice.text, "fields": dict(notice.fields)}


def from_json(key: str, entry: dict[str, Any]) -> Notice | None:
    """The owed notice, or None for an entry this version cannot read (left to a newer one)."""
    kind, text, fields = entry.get("notice"), entry.get("text"), entry.get("fields", {})
    if not isinstance(kind, str) or not isinstance(text, str) or not isinstance(fields, dict):
        return None
    return Notice(kind, text, key=key, fields={str(k): str(v) for k, v in fields.items()})


def sink(member: Owing) -> Callable[[Notice], Awaitable[None]]:
    """The standby's `login_notice`: the notice, owed on this instance's row."""

    async def owe(notice: Notice) -> None:
        written = await asyncio.get_running_loop().run_in_executor(None, _owe, member, notice)
        if not written:
            log.warning("owed.not_written", node=member.node, key=notice.key)

    return owe


def _owe(member: Owing, notice: Notice) -> bool:
    bound = max(1.0, member.renew_every)
    try:
        conn = postgres.connect(member.dsn, timeout=bound, statement_timeout=bound)
    except db.ERRORS as exc:
        log.warning("owed.failed", node=member.node, error=type(exc).__name__)
        return False
    try:
        return nodes.owe(
            conn,
            node=member.node,
            instance=member.instance,
            key=notice.key,
            notice=as_json(notice),
        )
    except db.ERRORS as exc:
        log.warning("owed.failed", node=member.node, error=type(exc).__name__)
        return False
    finally:
        conn.close()


async def record(
    conn: Callable[[], Any],
    run: Callable[[Callable[[], Any]], Awaitable[Any]],
    tell_owner: Callable[[Notice], Awaitable[None]],
) -> int:
    """The leader's part, each probe: every node's owed notices recorded through the journal
    (`tell_owner`), then cleared by key. `conn` gives the prober's connection and `run` runs a
    call in its thread. Answers how many were recorded."""
    owing = await run(lambda: nodes.owed(conn()))
    recorded = 0
    for node, entries in owing:
        done: list[str] = []
        for key, entry in entries.items():
            notice = from_json(key, entry)
            if notice is None:
                continue
            await tell_owner(notice)
            done.append(key)
        if done:
            await run(functools.partial(_settle, conn, node, done))
            log.info("owed.recorded", node=node, keys=done)
            recorded += len(done)
    return recorded


def _settle(conn: Callable[[], Any], node: str, keys: list[str]) -> None:
    nodes.settle(conn(), node, keys)
