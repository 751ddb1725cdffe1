"""Every sent owner message keeps the timestamp Signal answered (`201 {"timestamp": ...}`): the
id the owner's reply quotes (DESIGN.md section 13). Real sockets, the signal-cli-rest-api
stand-in, both engines.

Each test is named after the failure it kills.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import db
from ntfy_intake.testbed.signal_standin import SignalHandle
from ntfy_intake.wire.owner_channels import sent_timestamp

from ..owner_bed import OWNER, PARTNER, SENDER, run

pytestmark = pytest.mark.engines


def queue(conn: db.Connection, key: str) -> None:
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO owner_outbox(key, kind, topic, text, state, due_at, created_at)"
            " VALUES (?, 'triage', 'triage', 'disk full on nas', 'pending', 0, 0)",
            (key,),
        )


def send_all(conn: db.Connection, tmp_path: Path, signal: SignalHandle, clock: float) -> None:
    owner = OwnerSettings(
        signal_url=signal.url,
        signal_number=SENDER,
        recipients=(OWNER, PARTNER),
        fallback_topic=None,
    )

    async def scenario(make: Callable[..., OwnerSender]) -> None:
        await make(ntfy_url="", clock=lambda: clock).run_once()

    run(conn, tmp_path, owner, scenario)


def stored(conn: db.Connection) -> list[tuple[int, str]]:
    rows = conn.execute("SELECT signal_ts, key FROM owner_signal_sent ORDER BY signal_ts")
    return [(int(r[0]), str(r[1])) for r in rows.fetchall()]


def test_sent_owner_message_does_not_lose_the_timestamp_a_reply_quotes(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    queue(conn, "notify:a")
    queue(conn, "notify:b")
    send_all(conn, tmp_path, signal, 1_000.0)
    sent = signal.messages()
    assert len(sent) == 2
    assert sorted(k for _, k in stored(conn)) == ["notify:a", "notify:b"]
    assert [ts for ts, _ in stored(conn)] == sorted(m.timestamp for m in sent)


def test_partial_send_and_its_retry_do_not_lose_either_timestamp(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    """The owner got the first send, the partner the retry: either may quote its copy."""
    queue(conn, "notify:a")
    signal.faults.partial_failure_next(1, [PARTNER])
    send_all(conn, tmp_path, signal, 1_000.0)
    send_all(conn, tmp_path, signal, 2_000.0)
    sent = signal.messages()
    assert [m.recipients for m in sent] == [(OWNER,), (PARTNER,)]
    assert stored(conn) == [(sent[0].timestamp, "notify:a"), (sent[1].timestamp, "notify:a")]


def test_refused_send_stores_no_timestamp_a_reply_could_match(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    queue(conn, "notify:a")
    signal.faults.fail_next(1, 500)
    send_all(conn, tmp_path, signal, 1_000.0)
    assert stored(conn) == []


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"timestamp":"1764470000123"}', 1_764_470_000_123),
        (b'{"timestamp":1764470000123}', 1_764_470_000_123),
        (b'{"timestamp":"1764470000123","errors":[]}', 1_764_470_000_123),
        (b"", None),
        (b"not json", None),
        (b'{"timestamp":"-5"}', None),
        (b'{"timestamp":true}', None),
        (b'{"timestamp":"0"}', None),
        (b'{"timestamp":"\xd9\xa1\xd9\xa2"}', None),  # Arabic-Indic digits: isdigit() says yes
        (b"[1, 2]", None),
    ],
)
@pytest.mark.one_engine("parsing Signal's answer; no store")
def test_sent_timestamp_does_not_take_junk_for_a_timestamp(
    body: bytes, expected: int | None
) -> None:
    assert sent_timestamp(body) == expected
