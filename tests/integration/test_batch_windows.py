"""The debounce window is computed in one place (cadence.debounce_end): a request rebuilt from
the audit log closes when the live one did, to the millisecond."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake.store import audit, db, inbox, migrations, rebuild

from .. import harness
from ..conftest import make_message, owner_queue

pytestmark = pytest.mark.engines

# A sub-second debounce and a moment where the audit line's `ts` plus the debounce is not on the
# millisecond grid: the rebuild added them (1764470030.7510002), the live batch did not.
DEBOUNCE = 0.7
NOW = 1_764_470_030.0519


def _due(conn: db.Connection) -> float:
    (due,) = conn.execute("SELECT due_at FROM outbox WHERE state = 'collecting'").fetchone()
    return float(due)


def test_a_rebuilt_collecting_request_closes_when_the_live_one_did(
    store: db.Connection, tmp_path: Path
) -> None:
    inbox.record_batch(
        store,
        [make_message("window000001")],
        NOW,
        queue=owner_queue(debounce=DEBOUNCE),
        relay_enabled=True,
    )
    log = audit.AuditLog(tmp_path / "audit", clock=lambda: NOW)
    try:
        audit.flush(store, log)
    finally:
        log.close()
    live = _due(store)
    with harness.separate_store(tmp_path / "rebuilt") as target:
        conn = db.connect(target)
        try:
            migrations.apply(conn)
            summary = rebuild.from_audit(
                conn,
                tmp_path / "audit",
                NOW + 0.2,
                debounce=DEBOUNCE,
                relay_enabled=True,
                feed_append=None,
            )
            assert summary is not None and summary.requests == 1
            assert _due(conn) == live
        finally:
            conn.close()
