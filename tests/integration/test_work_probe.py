"""The readiness probe's questions to the outside (runtime/work_probe), in process, against the
ntfy emulator on real sockets and a real PostgreSQL store: a refused token is not sent again
every probe, a node whose ntfy lacks the leader's last message is not ready, and a node that
cannot reach the relay is not ready. Each test is named after the adversary finding it kills."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ntfy_intake.runtime.cluster import Member
from ntfy_intake.runtime.readiness import Prober
from ntfy_intake.settings import Settings
from ntfy_intake.store import cursor, db
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from .. import harness
from ..standby_nodes import free_port

pytestmark = pytest.mark.parametrize("engine", ["postgresql"], indirect=True)

GOOD = "tk_" + "g" * 29
STALE = "tk_" + "s" * 29
SECRET = "pr0be-S3cret"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(tokens={GOOD: ["alerts", "backups"]})).running() as emulator:
        yield emulator


def prober_for(
    tmp_path: Path, url: str, node: str, clock: Clock | None = None, **overrides: str
) -> Prober:
    assert harness.DATABASE is not None
    state = tmp_path / node
    state.mkdir(exist_ok=True)
    config: Settings = harness.settings_for(
        url, state, cluster_node=node, cluster_probe_every="1s", **overrides
    )
    assert isinstance(config.state.store, db.Dsn)
    member = Member(
        config.state.store, node=node, lease_ttl=8.0, renew_every=2.0, prefix=f"{node}."
    )
    member.prepare()
    if clock is None:
        return Prober(config, member)
    return Prober(config, member, monotonic=clock)


def probe(prober: Prober, times: int = 1) -> str | None:
    for _ in range(times):
        asyncio.run(prober.probe())
    return prober.not_ready_reason()


def closed(*probers: Prober) -> None:
    for prober in probers:
        prober.close()
        prober.member.close()


def polls(emu: NtfyEmulator) -> int:
    return len(emu.subscribe_log)


def test_a_refused_token_is_sent_once_per_backoff_not_every_probe(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    """ntfy's failed-login budget (30, one back a minute) is the address's, shared with the
    leader behind one NAT: ten probes within the first minute send the stale token once."""
    clock = Clock()
    prober = prober_for(tmp_path, emu.url, "beta", clock, ntfy_token=STALE)
    try:
        reason = probe(prober)
        assert polls(emu) == 1
        for _ in range(10):
            clock.now += 5.0
            reason = probe(prober)
        print(f"\n{reason}")
        assert polls(emu) == 1, "the refused token was sent again within the first minute"
        assert reason is not None and reason.startswith("ntfy answered HTTP 40"), reason
        assert "refused" in reason and STALE not in reason
        clock.now = 1000.0 + 61.0
        probe(prober)
        assert polls(emu) == 2  # one minute on: one more try, then two minutes' wait
        clock.now += 119.0
        probe(prober)
        assert polls(emu) == 2
        clock.now += 2.0
        probe(prober)
        assert polls(emu) == 3
    finally:
        closed(prober)


def test_a_node_on_another_ntfy_without_the_leader_s_last_message_is_not_ready(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    """Two ntfy servers behind one URL text (ntfy on each box, one config naming 127.0.0.1):
    the one that does not hold the message the leader last recorded is another server."""
    event = emu.publish("alerts", "recorded by the leader")
    conn = db.connect(db.Dsn(harness.DATABASE or ""))
    with NtfyEmulator(EmulatorConfig(tokens={GOOD: ["alerts", "backups"]})).running() as own:
        same = prober_for(tmp_path, emu.url, "alpha", ntfy_token=GOOD)
        other = prober_for(tmp_path, own.url, "beta", ntfy_token=GOOD)
        try:
            cursor.save(
                conn, cursor.Cursor.at_id(str(event["id"]), int(event["time"])), time.time()
            )
            probe(same, 2)  # the first probe reads the cursor, the second asks ntfy for it
            probe(other, 2)
            print(f"\nalpha: {same.not_ready_reason()}\nbeta: {other.not_ready_reason()}")
            assert same.not_ready_reason() is None
            reason = other.not_ready_reason()
            assert reason is not None, "a node on another ntfy server said ready"
            assert f"does not hold the leader's last message {event['id']}" in reason
        finally:
            closed(same, other)
            conn.close()


def test_a_node_that_cannot_reach_the_relay_is_not_ready_and_shows_no_credential(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    """relay.url on the leader's loopback, the same text on both boxes: the standby's route to
    it is dead. An origin that answers anything (the emulator: 404 for HEAD /) is reachable."""
    dead = f"http://intake:{SECRET}@127.0.0.1:{free_port()}/triage?key={SECRET}"
    host = emu.url.split("//")[1]
    alive = f"http://intake:{SECRET}@{host}/triage?key={SECRET}"
    cut = prober_for(tmp_path, emu.url, "beta", ntfy_token=GOOD, relay_url=dead)
    fine = prober_for(tmp_path, emu.url, "gamma", ntfy_token=GOOD, relay_url=alive)
    try:
        reason = probe(cut)
        print(f"\n{reason}")
        assert reason is not None and reason.startswith("relay unreachable from this node"), reason
        assert SECRET not in reason
        assert probe(fine) is None
    finally:
        closed(cut, fine)


@pytest.fixture
def answering() -> Iterator[dict[int, str]]:
    """Two origins on real sockets: one a proxy with nothing behind it (502 to everything),
    one a receiver that does not implement HEAD (501); status -> URL."""
    servers = []
    urls = {}
    for status in (502, 501):

        class Handler(BaseHTTPRequestHandler):
            answer = status

            def do_HEAD(self) -> None:
                self.send_response(self.answer)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        urls[status] = f"http://127.0.0.1:{server.server_address[1]}/triage"
    try:
        yield urls
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_a_proxy_with_nothing_behind_it_is_no_relay_but_a_501_is(
    tmp_path: Path, emu: NtfyEmulator, answering: dict[int, str]
) -> None:
    proxied = prober_for(tmp_path, emu.url, "beta", ntfy_token=GOOD, relay_url=answering[502])
    bare = prober_for(tmp_path, emu.url, "gamma", ntfy_token=GOOD, relay_url=answering[501])
    try:
        reason = probe(proxied)
        assert reason is not None and reason.endswith(": HTTP 502)"), reason
        assert probe(bare) is None
    finally:
        closed(proxied, bare)
