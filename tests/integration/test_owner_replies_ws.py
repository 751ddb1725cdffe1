"""websocket mode (signal-cli-rest-api json-rpc mode: `ws://.../v1/receive/<number>`, one
envelope per text frame): replies are handled as they arrive, and a peer that stops answering
pings is left and reconnected instead of listened to forever. Real sockets, both engines.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ntfy_intake.flow.owner_replies import OwnerReplies
from ntfy_intake.rules import cadence
from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import audit, db
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.testbed import signal_standin

from ..owner_bed import OWNER, SENDER

pytestmark = pytest.mark.engines


def replies_for(
    conn: db.Connection, client: httpx.AsyncClient, url: str, log: audit.AuditLog, **kw: float
) -> OwnerReplies:
    async def flush() -> bool:
        audit.flush(conn, log)
        return True

    owner = OwnerSettings(
        signal_url=url,
        signal_number=SENDER,
        recipients=(OWNER,),
        fallback_topic=None,
        receive="websocket",
        receive_every=1.0,
    )
    return OwnerReplies(
        conn,
        client,
        run_db=db.run_inline,
        owner=owner,
        queue=OwnerQueue(cadence.Policy(), cadence.CadenceState.empty(cadence.Policy())),
        clock=time.time,
        flush_audit=flush,
        wake_sender=lambda: None,
        status_line=lambda: "healthy",
        timeout=2.0,
        **kw,
    )


def test_websocket_reply_is_handled_as_it_arrives(conn: db.Connection, tmp_path: Path) -> None:
    with signal_standin.running() as sig:

        async def main() -> None:
            with audit.AuditLog(tmp_path / "audit", time.time) as log:
                async with httpx.AsyncClient() as client:
                    replies = replies_for(conn, client, sig.url, log)
                    stop = asyncio.Event()
                    task = asyncio.create_task(replies.listen(stop))
                    sig.inbox.inject(SENDER, OWNER, "status")
                    sig.inbox.inject(SENDER, OWNER, "help")
                    for _ in range(250):
                        if replies.stats.by_result.get("help", 0):
                            break
                        await asyncio.sleep(0.02)
                    stop.set()
                    await asyncio.wait_for(task, 5)
                    assert replies.stats.by_result == {"status": 1, "help": 1}
                    assert replies.stats.receive_failures == 0

        asyncio.run(main())
    rows = conn.execute("SELECT command, result FROM owner_replies ORDER BY envelope_ts")
    assert [tuple(r) for r in rows.fetchall()] == [("status", "status"), ("help", "help")]


@pytest.fixture
def deaf_peer() -> Iterator[str]:
    """Completes the WebSocket handshake, then reads and ignores everything: no pong, ever
    (a half-open connection, as after a NAT or proxy dropped it)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    done = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                peer, _ = server.accept()
            except TimeoutError:
                continue
            held.append(peer)
            request = b""
            while b"\r\n\r\n" not in request:
                request += peer.recv(4096)
            key = next(
                line.split(b":", 1)[1].strip()
                for line in request.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-key:")
            )
            guid = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
            accept = base64.b64encode(hashlib.sha1(key + guid).digest())
            peer.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
            )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join(5)
        for peer in held:
            peer.close()
        server.close()


@pytest.mark.one_engine("websocket pings on the wire; no store behaviour under test")
def test_peer_that_stops_answering_pings_is_left_not_listened_to_forever(
    conn: db.Connection, tmp_path: Path, deaf_peer: str
) -> None:
    async def main() -> None:
        with audit.AuditLog(tmp_path / "audit", time.time) as log:
            async with httpx.AsyncClient() as client:
                replies = replies_for(
                    conn, client, deaf_peer, log, ping_every=0.2, ping_deadline=0.3
                )
                started = time.monotonic()
                await asyncio.wait_for(replies.listen(asyncio.Event()), 10)
                assert time.monotonic() - started < 5
                assert replies.stats.receive_failures == 1
                assert replies.failing_since is not None  # counts towards receive_dead_after

    asyncio.run(main())


@pytest.mark.one_engine("websocket pings on the wire; no store behaviour under test")
def test_quiet_websocket_whose_pings_are_answered_is_not_reported_as_stale(
    conn: db.Connection, tmp_path: Path
) -> None:
    """json-rpc mode may carry no frame for days: `status` and /metrics showed the path's last
    receive as the connect, ageing for ever on a connection that works."""
    with signal_standin.running() as sig:

        async def main() -> None:
            with audit.AuditLog(tmp_path / "audit", time.time) as log:
                async with httpx.AsyncClient() as client:
                    replies = replies_for(
                        conn, client, sig.url, log, ping_every=0.2, ping_deadline=2.0
                    )
                    stop = asyncio.Event()
                    task = asyncio.create_task(replies.listen(stop))
                    for _ in range(250):
                        if replies.stats.last_ok is not None:
                            break
                        await asyncio.sleep(0.02)
                    connected = replies.stats.last_ok
                    assert connected is not None
                    await asyncio.sleep(1.5)  # no frame; several pings answered
                    stop.set()
                    await asyncio.wait_for(task, 5)
                    assert replies.stats.last_ok is not None
                    assert replies.stats.last_ok - connected >= 0.5
                    assert replies.stats.receive_failures == 0

        asyncio.run(main())
