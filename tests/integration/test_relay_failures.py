"""Relay failure modes: the daemon, the bundled ntfy server and the reference receiver on loopback.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ntfy_intake.flow import database, relay, relay_wakeup
from ntfy_intake.runtime.daemon import Daemon
from ntfy_intake.store import audit, db, inbox, outbox
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import NtfyEmulator
from ntfy_intake.wire import signing

from .. import harness, ports
from ..conftest import make_message, owner_queue
from ..harness import (
    CommitFaults,
    DaemonThread,
    cursor_row,
    daemon_process,
    env_for,
    event_ids,
    query,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.engines


def deliveries(state: Path, key: str) -> list[dict[str, object]]:
    return [
        r
        for r in audit.read_records(state / "audit")
        if r["kind"] == "delivery" and r["delivery_key"] == key
    ]


def only_key(state: Path) -> str:
    ((key,),) = query(state, "SELECT delivery_key FROM outbox")
    return str(key)


def delivered(state: Path) -> bool:
    return query(state, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == [(1,)]


def test_receiver_that_commits_then_times_out_ends_with_one_receipt_and_retry_reuses_the_key(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        triage.faults.commit_then_stall(2.0)
        config = settings_for(
            emu.url, state, relay_url=triage.url, relay_timeout="500ms", cadence_debounce="0s"
        )
        with DaemonThread(config):
            emu.wait_for_subscribers(1)
            emu.publish("alerts", "disk full", title="Disk")
            wait_until(lambda: query(state, "SELECT count(*) FROM outbox") == [(1,)])
            wait_until(lambda: delivered(state), timeout=30)
        key = only_key(state)
        (receipt,) = receiver.receipts(triage.db_path)
        assert receipt.key == key and receipt.repeats >= 1
        results = [d["result"] for d in deliveries(state, key)]
        assert results[0] == "retry" and results[-1] == "delivered"


def test_503_three_times_then_200_delivers(emu: NtfyEmulator, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        triage.faults.fail_next(3, status=503)
        config = settings_for(emu.url, state, relay_url=triage.url, cadence_debounce="0s")
        with DaemonThread(config):
            emu.wait_for_subscribers(1)
            emu.publish("alerts", "disk full", title="Disk")
            wait_until(lambda: delivered(state), timeout=30)
        key = only_key(state)
        assert [(d["attempt"], d["result"]) for d in deliveries(state, key)] == [
            (1, "retry"),
            (2, "retry"),
            (3, "retry"),
            (4, "delivered"),
        ]
        (receipt,) = receiver.receipts(triage.db_path)
        assert (receipt.key, receipt.repeats) == (key, 0)


def _one_pending_row(conn) -> str:  # type: ignore[no-untyped-def]
    inbox.record_batch(
        conn, [make_message("aaaaaaaaaaa1")], 0.0, queue=owner_queue(), relay_enabled=True
    )
    ((key,),) = conn.execute("SELECT delivery_key FROM outbox WHERE state = 'pending'").fetchall()
    return str(key)


def test_429_retry_after_waits_at_least_that_long_with_an_injected_clock(store) -> None:  # type: ignore[no-untyped-def]
    key = _one_pending_row(store)
    now = {"t": 0.0}
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Idempotency-Key"])
        if len(seen) == 1:
            return httpx.Response(429, headers={"Retry-After": "30"})
        return httpx.Response(200, json={"accepted": True})

    async def flushed() -> bool:
        return True

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = relay.Relay(
                store,
                client,
                run_db=db.run_inline,
                owner_queue=owner_queue(),
                url="http://receiver.invalid/triage",
                timeout=5,
                max_attempts=8,
                clock=lambda: now["t"],
                flush_audit=flushed,
                rng=lambda: 0.0,
                retry_base=0.01,
            )
            assert await r.run_once()
            now["t"] = 29.9
            assert not await r.run_once()  # not due yet: Retry-After is a floor
            now["t"] = 30.0
            assert await r.run_once()

    asyncio.run(scenario())
    assert seen == [key, key]
    assert tuple(store.execute("SELECT state, attempts FROM outbox").fetchone()) == ("delivered", 2)


def test_permanent_400_makes_the_row_dead_at_once_and_redrive_delivers(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        triage.faults.reject_next(400)
        config = settings_for(emu.url, state, relay_url=triage.url, cadence_debounce="0s")
        with DaemonThread(config):
            emu.wait_for_subscribers(1)
            emu.publish("alerts", "disk full", title="Disk")
            wait_until(lambda: query(state, "SELECT state, attempts FROM outbox") == [("dead", 1)])
            key = only_key(state)
            conn = db.connect(harness.store_of(state))
            try:
                assert outbox.redrive(conn, None, 0.0) == [key]
            finally:
                conn.close()
            relay_wakeup.nudge(state)  # as `ntfy-intake redrive` does: the relay's poll is long
            wait_until(lambda: delivered(state), timeout=30)
        assert [d["result"] for d in deliveries(state, key)] == ["dead", "redriven", "delivered"]
        assert query(state, "SELECT count(*) FROM owner_outbox WHERE key LIKE 'dead_row:%'") == [
            (1,)
        ]


def test_webhook_outage_never_stalls_intake(emu: NtfyEmulator, tmp_path: Path) -> None:
    dead_port = ports.free_port()  # a port with nobody listening
    state = tmp_path / "state"
    config = settings_for(
        emu.url, state, relay_url=f"http://127.0.0.1:{dead_port}/triage", cadence_debounce="0s"
    )
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
        ids = [emu.publish("alerts", f"alert {n}", title=f"incident {n}")["id"] for n in range(20)]
        wait_until(lambda: set(ids) <= set(event_ids(state)))
        wait_until(
            lambda: cursor_row(state) == ("id", ids[-1]), what="cursor moved past every event"
        )
        wait_until(lambda: query(state, "SELECT min(attempts) FROM outbox")[0][0] >= 1)
    assert query(state, "SELECT count(*) FROM outbox WHERE state IN ('pending', 'leased')") == [
        (20,)
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "restart_receiver", [False, True], ids=["same-receiver", "receiver-restarted"]
)
def test_kill9_after_post_before_settle_redelivers_the_same_key_with_one_receipt(
    emu: NtfyEmulator, tmp_path: Path, restart_receiver: bool
) -> None:
    state = tmp_path / "state"
    receipts_db = tmp_path / "receiver.sqlite3"
    with contextlib.ExitStack() as stack:
        triage = stack.enter_context(receiver.running(receipts_db))
        env = env_for(emu.url, state, relay_url=triage.url, cadence_debounce="0s")
        with daemon_process(env, extra_env={"NTFY_INTAKE_TEST_CRASH_AT": "after_post"}) as proc:
            emu.wait_for_subscribers(1)
            emu.publish("alerts", "disk full", title="Disk")
            assert proc.wait(timeout=20) == -signal.SIGKILL  # killed itself right after the POST
        assert query(state, "SELECT state FROM outbox") == [("leased",)]
        assert len(receiver.receipts(receipts_db)) == 1  # the receiver did commit the effect
        if restart_receiver:
            stack.close()
            triage = stack.enter_context(receiver.running(receipts_db))
            env = env_for(emu.url, state, relay_url=triage.url, cadence_debounce="0s")
        key = only_key(state)
        with daemon_process(env):
            # The audit line, not the outbox row: the row commits first, and a kill between the
            # two leaves the line to the next start's recovery, after this test has looked.
            wait_until(lambda: bool(deliveries(state, key)), timeout=30)
        (receipt,) = receiver.receipts(receipts_db)
        assert receipt.key == key and receipt.repeats == 1
        assert [d["result"] for d in deliveries(state, key)] == ["delivered"]


# -- signed deliveries, a total deadline per attempt, replies that are not valid Unicode ----------

SECRET = signing.new_secret(bytes(range(32)))


async def _flushed() -> bool:
    return True


def _relay(store, client: httpx.AsyncClient, url: str, **kwargs) -> relay.Relay:  # type: ignore[no-untyped-def]
    options = {
        "timeout": 5.0,
        "max_attempts": 8,
        "clock": time.time,
        "rng": lambda: 0.0,
        "retry_base": 0.01,
        **kwargs,
    }
    return relay.Relay(
        store,
        client,
        run_db=db.run_inline,
        owner_queue=owner_queue(),
        url=url,
        flush_audit=_flushed,
        **options,
    )


def test_forged_delivery_under_a_guessed_key_is_refused_and_the_real_one_is_delivered(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    key_bytes = signing.parse_secret(SECRET)
    with receiver.running(tmp_path / "receiver.sqlite3", secret=key_bytes) as triage:
        config = settings_for(
            emu.url, state, relay_url=triage.url, relay_secret=SECRET, cadence_debounce="2s"
        )
        with DaemonThread(config):
            emu.wait_for_subscribers(1)
            event_id = emu.publish("alerts", "disk full", title="Disk")["id"]
            guessed = f"tri_{event_id}"  # every subscriber of the topic sees the id
            forged = json.dumps(
                {
                    "schema": receiver.SCHEMA,
                    "delivery_key": guessed,
                    "incident": {"key": "x", "severity": 1, "status": "resolved"},
                    "events": [],
                }
            ).encode()
            attacker = signing.new_secret(b"\x01" * 32)  # a guessed secret
            for headers in (
                {},
                signing.sign(signing.parse_secret(attacker), guessed, forged, time.time()),
            ):
                answer = httpx.post(
                    triage.url,
                    content=forged,
                    headers={"Idempotency-Key": guessed, **headers},
                    timeout=10,
                )
                assert answer.status_code == 401, answer.text
                assert answer.json()["error"] == "unauthorized"
            assert receiver.receipts(triage.db_path) == []
            wait_until(lambda: delivered(state), timeout=30)
        key = only_key(state)
        assert key == guessed
        (receipt,) = receiver.receipts(triage.db_path)
        ((payload,),) = query(state, "SELECT payload FROM outbox")
        assert receipt.key == key
        assert receipt.body_sha256 == receiver.body_sha256(json.loads(payload))
        assert [d["result"] for d in deliveries(state, key)] == ["delivered"]


def test_each_attempt_is_signed_when_sent_and_keeps_its_idempotency_key(store) -> None:  # type: ignore[no-untyped-def]
    key = _one_pending_row(store)
    seen: list[httpx.Request] = []
    now = {"t": 1_800_000_000.0}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503 if len(seen) == 1 else 200, json={})

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = _relay(
                store,
                client,
                "http://receiver.invalid/triage",
                clock=lambda: now["t"],
                signing_key=signing.parse_secret(SECRET),
                token="rx-token",
            )
            assert await r.run_once()
            now["t"] += 400.0  # later than the tolerance: a stale signature would be refused
            assert await r.run_once()

    asyncio.run(scenario())
    assert [r.headers["webhook-timestamp"] for r in seen] == ["1800000000", "1800000400"]
    for request, at in zip(seen, (1_800_000_000.0, 1_800_000_400.0), strict=True):
        assert request.headers["Idempotency-Key"] == request.headers["webhook-id"] == key
        assert request.headers["Authorization"] == "Bearer rx-token"
        assert (
            signing.verify(signing.parse_secret(SECRET), request.headers, request.content, at)
            is None
        )
    assert tuple(store.execute("SELECT state FROM outbox").fetchone()) == ("delivered",)


def test_401_from_the_receiver_is_retried_and_noticed_once_never_dead_at_once(store) -> None:  # type: ignore[no-untyped-def]
    _one_pending_row(store)
    answers = [401, 401, 401, 200]
    now = {"t": 0.0}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(answers.pop(0), json={"error": "unauthorized"})

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = _relay(store, client, "http://receiver.invalid/triage", clock=lambda: now["t"])
            for _ in range(4):
                now["t"] += 1000.0
                assert await r.run_once()

    asyncio.run(scenario())
    assert answers == []
    assert tuple(store.execute("SELECT state, attempts FROM outbox").fetchone()) == ("delivered", 4)
    notices = store.execute(
        "SELECT key FROM owner_outbox WHERE key LIKE 'relay_unauthorized:%'"
    ).fetchall()
    assert len(notices) == 1


def _trickling_server(stop: threading.Event) -> tuple[socket.socket, threading.Thread]:
    """Answers every request with a 200 whose 1,000-byte body arrives one byte every 0.2 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)

    def serve() -> None:
        conns: list[socket.socket] = []
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = listener.accept()
                conns.append(conn)
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
                for _ in range(1000):
                    if stop.wait(0.2):
                        break
                    with contextlib.suppress(OSError):
                        conn.sendall(b" ")
        for conn in conns:
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_receiver_trickling_one_byte_at_a_time_cannot_stretch_an_attempt(store) -> None:  # type: ignore[no-untyped-def]
    _one_pending_row(store)
    stop = threading.Event()
    listener, thread = _trickling_server(stop)
    port = listener.getsockname()[1]
    try:

        async def scenario() -> tuple[float, relay.Outcome]:
            async with httpx.AsyncClient() as client:
                r = _relay(store, client, f"http://127.0.0.1:{port}/triage", timeout=1.0)
                ((claim),) = outbox.claim_due(store, time.time(), limit=1, lease=60)
                started = time.monotonic()
                outcome = await r.attempt(claim)
                return time.monotonic() - started, outcome

        elapsed, outcome = asyncio.run(scenario())
    finally:
        stop.set()
        thread.join(5)
        listener.close()
    assert outcome.kind == "retry" and "timeout" in outcome.detail
    # The trickle would take 200 s; per-read timeouts never fire because a byte keeps coming.
    assert elapsed < 20.0


def test_lone_surrogate_in_receiver_reply_does_not_stop_the_relay(store) -> None:  # type: ignore[no-untyped-def]
    key = _one_pending_row(store)
    reply = b'{"notify":{"text":"Disk full \\ud83d"}}'

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=reply, headers={"Content-Type": "application/json"})

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            assert await _relay(store, client, "http://receiver.invalid/triage").run_once()

    asyncio.run(scenario())
    assert tuple(store.execute("SELECT state FROM outbox").fetchone()) == ("delivered",)
    ((text,),) = store.execute(
        "SELECT text FROM owner_outbox WHERE key = ?", (f"notify:{key}",)
    ).fetchall()
    assert text == "Disk full \ufffd"


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    """A recovered daemon whose steps are driven directly: its `_db` is the runner that waits
    out a transient storage fault and runs the transaction again."""
    monkeypatch.setattr(database, "STORAGE_RETRY_BASE", 0.001)
    found = Daemon(settings_for("http://127.0.0.1:9", tmp_path, cadence_debounce="0s"))
    found.recover()
    yield found
    found.close()


def test_401_notice_survives_a_commit_fault_in_the_settle_transaction(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver answered 401 and the settle's COMMIT failed once (an fsync's EIO): the
    relay's streak had moved inside the transaction, so the retried transaction took the notice
    as already sent and the owner never heard of the 401s (0 notices, not the promised 1)."""
    faults = CommitFaults(monkeypatch)
    inbox.record_batch(
        daemon.conn,
        [make_message("aaaaaaaaaaa1")],
        time.time(),
        queue=daemon.owner_queue,
        relay_enabled=True,
    )
    answers = [401, 401, 200]
    now = {"t": time.time()}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(answers.pop(0), json={"error": "unauthorized"})

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            r = relay.Relay(
                daemon.conn,
                client,
                run_db=daemon.database.run,
                owner_queue=daemon.owner_queue,
                url="http://receiver.invalid/triage",
                timeout=5.0,
                max_attempts=8,
                clock=lambda: now["t"],
                flush_audit=daemon.journal.flush,
                rng=lambda: 0.0,
                retry_base=0.01,
            )
            # The first transaction there is the claim; the second settles the first 401.
            faults.fail_once("Relay._settle_and_claim", skip=1)
            for _ in range(3):
                assert await r.run_once()
                now["t"] += 1000.0

    asyncio.run(scenario())

    assert faults.fired == ["Relay._settle_and_claim"]
    assert answers == []
    assert query(tmp_path, "SELECT state, attempts FROM outbox") == [("delivered", 3)]
    notices = query(tmp_path, "SELECT key FROM owner_outbox WHERE key LIKE 'relay_unauthorized:%'")
    assert len(notices) == 1
    audited = [
        r
        for r in audit.read_records(tmp_path / "audit")
        if r["kind"] == "notice" and r["notice"] == "relay_unauthorized"
    ]
    assert len(audited) == 1
