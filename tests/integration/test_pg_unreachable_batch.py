"""Found by `drill --faults storage --database DSN --pg-data DIR` (pg_restart): a batch written
while the PostgreSQL server restarts failed with the driver's OperationalError, which the inbox
took for a value that breaks processing. It went one by one, each frame's write failed again
(the reconnect refused: the server still down), the frames were "quarantined", the quarantine
write failed too, and the batch returned as handled: the cursor moved past events that have no
inbox row and no audit line (lost). A lost connection is storage: it must propagate, so the
daemon waits it out and runs the same batch again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ntfy_intake.store import db, inbox, migrations, postgres

from .. import engines
from ..conftest import make_message, owner_queue

NOW = 1_764_470_100.0


def test_a_batch_written_while_the_server_is_down_propagates_and_quarantines_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = engines.server_dsn()
    if server is None:
        if os.environ.get("CI") == "true":
            pytest.fail(engines.unavailable())
        pytest.skip(engines.unavailable())
    schema, dsn = engines.create_schema(server)
    try:
        conn = db.connect(dsn)
        migrations.apply(conn)
        killer = db.connect(server)
        assert isinstance(conn, postgres.PgConnection)
        killer.execute("SELECT pg_terminate_backend(?)", (conn.raw.info.backend_pid,))
        killer.close()

        def refused(*_args: object, **_kw: object) -> None:
            raise postgres.DRIVER_OPERATIONAL("connection failed: Connection refused")

        monkeypatch.setattr(postgres, "_open", refused)
        frames = [make_message("lost00000001", title="a"), make_message("lost00000002", title="b")]
        with pytest.raises(db.ERRORS):
            inbox.record_batch(
                conn, frames, NOW, queue=owner_queue(debounce=60.0), relay_enabled=True
            )
        monkeypatch.undo()
        rows = conn.execute("SELECT count(*) FROM inbox").fetchone()
        assert rows[0] == 0
        assert conn.execute("SELECT count(*) FROM quarantine").fetchone()[0] == 0
        conn.close()
    finally:
        engines.drop_schema(server, schema)
