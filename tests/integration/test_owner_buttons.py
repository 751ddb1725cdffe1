"""The fallback topic's "Ack" and "Silence 2h" buttons (DESIGN.md section 13), over real
sockets on both engines: the owner sender publishes to the ntfy emulator's fallback topic, the
message is read back from the emulator's cache as the ntfy app gets it, and its buttons are
pressed as the app presses them (the action's method, url, headers and body) against the HTTP
surface with the buttons' route, on a real store. Time is injected (the buttons' clock).

Each test is named after the failure it kills.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import httpx
import pytest

from ntfy_intake.flow import owner_buttons
from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.rules import action_tokens, cadence
from ntfy_intake.settings import OwnerSettings
from ntfy_intake.store import audit, db, migrations
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.surfaces import http_api, owner_actions
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import store_of

pytestmark = pytest.mark.engines

FALLBACK = "owner-notices"
T0 = 1_764_470_000.0
P = ParamSpec("P")
T = TypeVar("T")


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emulator:
        yield emulator


def incident(conn: db.Connection, key: str, version: int = 1) -> None:
    with db.write_txn(conn):
        conn.execute(
            "INSERT INTO incidents(key, severity, status, status_time, status_event, first_seen,"
            " last_seen, events, version) VALUES (?, 4, 'firing', 1, 'e1', 1, 1, 1, ?)",
            (key, version),
        )


class World:
    """One store, the owner sender on the emulator's fallback topic, and the HTTP surface with
    the buttons' route on a real socket. Store calls from the test and from the server's thread
    take one lock (one connection)."""

    def __init__(self, conn: db.Connection, tmp_path: Path, emu: NtfyEmulator) -> None:
        self.conn = conn
        self.tmp_path = tmp_path
        self.emu = emu
        # The module's emulator is shared: a topic each (not id(self): CPython reuses a freed
        # World's id, and the next test read the earlier one's messages).
        self.topic = f"{FALLBACK}-{secrets.token_hex(6)}"
        self.clock = Clock()
        self.lock = threading.Lock()
        self.queue = OwnerQueue(cadence.Policy(), cadence.CadenceState.empty(cadence.Policy()))
        self.log = audit.AuditLog(tmp_path / "audit", lambda: T0)
        self.client = httpx.AsyncClient()
        self.sender = OwnerSender(
            conn,
            self.client,
            run_db=self.run_db,
            owner=OwnerSettings(
                signal_url=None, signal_number=None, recipients=(), fallback_topic=self.topic
            ),
            ntfy_url=emu.url,
            ntfy_token=None,
            clock=self.clock,
            flush_audit=self.flush,
            timeout=5.0,
            rng=lambda: 0.0,
        )
        self.buttons: owner_buttons.OwnerButtons | None = None
        self.url = ""

    async def run_db(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        with self.lock:
            return fn(*args, **kwargs)

    async def flush(self) -> bool:
        with self.lock:
            audit.flush(self.conn, self.log)
        return True

    def app(self, routes: list[Any]) -> Any:
        return http_api.create_app(
            db_path=store_of(self.tmp_path),
            token=None,
            notify=None,
            health=lambda: (True, {}),
            metrics_snapshot=dict,
            extra_routes=routes,
        )

    def message(self, delivery_key: str, incident_key: str) -> str:
        with self.lock, db.write_txn(self.conn) as txn:
            self.conn.execute(
                "INSERT INTO outbox(delivery_key, incident_key, reason, state, due_at, created_at)"
                " VALUES (?, ?, 'new_incident', 'delivered', 0, 0)",
                (delivery_key, incident_key),
            )
            result, _ = self.queue.triage_message(
                txn, f"notify:{delivery_key}", f"about {incident_key}", self.clock()
            )
        return result

    def reason(self, key: str) -> str | None:
        with self.lock:
            row = self.conn.execute(
                "SELECT last_error FROM owner_outbox WHERE key = ?", (key,)
            ).fetchone()
        return None if row is None else row[0]

    def send(self) -> None:
        asyncio.run(self._send())

    async def _send(self) -> None:
        async with httpx.AsyncClient() as client:
            self.sender.client = client
            await self.sender.run_once()

    def published(self) -> list[dict[str, Any]]:
        """The fallback topic's messages as a subscriber gets them: the emulator's cache over
        HTTP (`poll=1`), each line one event."""
        response = httpx.get(f"{self.emu.url}/{self.topic}/json?poll=1", timeout=10)
        response.raise_for_status()
        return [httpx.Response(200, content=line).json() for line in response.text.splitlines()]

    def buttons_of(self, needle: str) -> dict[str, dict[str, Any]]:
        """The actions of the one published message whose text names `needle`, by label."""
        [found] = [m for m in self.published() if needle in m.get("message", "")]
        return {a["label"]: a for a in found.get("actions", [])}

    def records(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in audit.read_records(self.tmp_path / "audit") if r["kind"] == kind]


def press(
    action: dict[str, Any], *, body: str | None = None, url: str | None = None
) -> httpx.Response:
    """What ntfy's app does for an `http` action: its method to its url with its headers and
    body (`body`/`url` replace them, for a tampered press)."""
    return httpx.request(
        action.get("method", "POST"),
        url or action["url"],
        headers=action.get("headers", {}),
        content=(action.get("body", "") if body is None else body).encode(),
        timeout=10,
    )


@pytest.fixture
def world(tmp_path: Path, emu: NtfyEmulator) -> Iterator[World]:
    conn = db.connect(store_of(tmp_path))
    migrations.apply(conn)
    incident(conn, "alerts:disk")
    incident(conn, "alerts:cpu")
    made = World(conn, tmp_path, emu)
    buttons = owner_buttons.attach(made.sender, made.queue, "http://placeholder")
    assert buttons is not None
    made.buttons = buttons
    app = made.app(owner_actions.routes(buttons))
    with made.log, _serve.serving(app) as url:
        made.url = url
        buttons.public_url = url  # the address the surface got (port 0)
        yield made
    conn.close()


def tamper(token: str, *, key: str | None = None, mac_flip: bool = False) -> str:
    head, tail = token.split(".")
    payload = base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))
    mac = base64.urlsafe_b64decode(tail + "=" * (-len(tail) % 4))
    if key is not None:
        version, action, expires, _ = payload.decode().split("\n", 3)
        payload = f"{version}\n{action}\n{expires}\n{key}".encode()
    if mac_flip:
        mac = bytes([mac[0] ^ 1]) + mac[1:]

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    return f"{b64(payload)}.{b64(mac)}"


# -- the buttons' way: publish, read back, press ---------------------------------------------------


def test_ack_button_stops_later_messages_for_that_incident_but_not_others(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    assert world.message("c1", "alerts:cpu") == "queued"
    world.send()
    disk = world.buttons_of("alerts:disk")
    assert set(disk) == {"Ack", "Silence 2h"}
    ack = disk["Ack"]
    assert (ack["action"], ack["method"], ack["clear"]) == ("http", "POST", True)
    assert ack["url"] == f"{world.url}/v1/owner/buttons/ack"
    assert disk["Silence 2h"]["url"] == f"{world.url}/v1/owner/buttons/silence_2h"
    assert ack["url"].split("/")[-1] not in ack["body"]  # the token is in the body only

    answer = press(ack)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == "acknowledged"
    assert answer.json()["incident"] == "alerts:disk"
    assert answer.headers["access-control-allow-origin"] == "*"

    assert world.message("d2", "alerts:disk") == "suppressed"
    assert world.reason("notify:d2") == "acknowledged"
    assert world.message("c2", "alerts:cpu") == "queued"
    [line] = world.records("owner_reply")
    assert (line["command"], line["result"], line["via"], line["incident"], line["key"]) == (
        "ack",
        "acknowledged",
        "button",
        "alerts:disk",
        "notify:d1",
    )
    assert line["address"] == "127.0.0.1"  # who pressed, as for a refusal
    assert ack["body"] not in str(world.records("owner_reply"))


def test_silence_button_holds_for_two_hours_then_ends(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    answer = press(world.buttons_of("alerts:disk")["Silence 2h"])
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == "silenced"
    [made] = world.records("silence")
    assert (made["scope"], made["target"]) == ("incident", "alerts:disk")
    world.clock.t += 2 * 3600 - 60
    assert world.message("d2", "alerts:disk") == "suppressed"
    assert world.reason("notify:d2") == "silenced"
    world.clock.t += 120
    assert world.message("d3", "alerts:disk") == "queued"


def test_notice_about_no_incident_carries_no_buttons(world: World) -> None:
    with world.lock, db.write_txn(world.conn) as txn:
        world.queue.triage_message(txn, "notify:agent-own", "from the agent", world.clock())
    world.send()
    [message] = world.published()
    assert "actions" not in message


# -- tokens that must act on nothing -------------------------------------------------------------


def test_forged_token_is_refused_audited_and_changes_nothing(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    answer = press(ack, body=tamper(ack["body"], mac_flip=True))
    assert answer.status_code == 403
    assert answer.json()["why"] == "forged"
    assert world.message("d2", "alerts:disk") == "queued"
    [line] = world.records("owner_reply")
    assert (line["result"], line["why"], line["via"]) == ("refused", "forged", "button")
    assert "key" not in line  # nothing read from an unverified token is recorded
    assert line["address"] == "127.0.0.1"


def test_replayed_token_has_one_effect(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    silence = world.buttons_of("alerts:disk")["Silence 2h"]
    assert press(silence).status_code == 200
    again = press(silence)
    assert again.status_code == 409
    assert again.json() == {
        "error": "already_done",
        "result": "silenced",
        "message": "that button was pressed before; nothing more was done",
    }
    assert len(world.records("silence")) == 1
    assert [r["result"] for r in world.records("owner_reply")] == ["silenced", "already_done"]


def test_same_button_of_a_message_published_twice_acts_once(world: World) -> None:
    """A retried publish carries a second token (a later expiry) for the same message and
    button: one use between them."""
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    first = world.buttons_of("alerts:disk")["Silence 2h"]
    assert world.buttons is not None
    world.clock.t += 60
    [second] = [
        v for k, v in asyncio.run(world.buttons.headers_for("notify:d1")).items() if k == "Actions"
    ]
    token = second.split('body="')[2].split('"')[0]  # the second action's: silence_2h
    assert token != first["body"]
    assert press(first).status_code == 200
    assert press(first, body=token).status_code == 409
    assert len(world.records("silence")) == 1


def test_expired_token_is_refused_and_changes_nothing(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    world.clock.t += action_tokens.TTL + 1
    answer = press(ack)
    assert answer.status_code == 410
    assert answer.json()["error"] == "expired"
    assert world.message("d2", "alerts:disk") == "queued"
    [line] = world.records("owner_reply")
    assert (line["result"], line["why"], line["key"]) == ("expired", "expired", "notify:d1")


def test_token_for_another_messages_key_is_refused(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    assert world.message("c1", "alerts:cpu") == "queued"
    world.send()
    disk_ack = world.buttons_of("alerts:disk")["Ack"]
    answer = press(disk_ack, body=tamper(disk_ack["body"], key="notify:c1"))
    assert answer.status_code == 403
    assert answer.json()["why"] == "forged"
    assert world.message("c2", "alerts:cpu") == "queued"
    assert world.message("d2", "alerts:disk") == "queued"


def test_wrong_action_is_refused_and_changes_nothing(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    buttons = world.buttons_of("alerts:disk")
    answer = press(buttons["Ack"], url=buttons["Silence 2h"]["url"])
    assert answer.status_code == 403
    assert answer.json()["why"] == "wrong_action"
    assert world.records("silence") == []
    assert world.message("d2", "alerts:disk") == "queued"
    # The refusal did not use the token up: pressed where it belongs, it still acts.
    assert press(buttons["Ack"]).status_code == 200


def test_refused_tokens_count_as_failed_logins_so_they_cannot_be_guessed(world: World) -> None:
    """Also kills the ntfy web app's fetch() seeing a network error where the daemon said
    "held, retry in N s" (429) or "no such button" (404): those answers lacked the CORS header
    the others carry, so a browser hid them from the page."""
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    refused = [press(ack, body=f"guess{i}.AAAA") for i in range(5)]
    assert [answer.status_code for answer in refused] == [403] * 5
    held = press(ack)  # the right token, but the address is held: not even looked at
    assert held.status_code == 429
    assert int(held.headers["retry-after"]) > 0
    unknown = press(ack, url=ack["url"].rsplit("/", 1)[0] + "/reboot")
    assert unknown.status_code == 404
    for answer in (*refused, held, unknown):
        assert answer.headers["access-control-allow-origin"] == "*"
        assert answer.headers["cache-control"] == "no-store"
    assert world.message("d2", "alerts:disk") == "queued"
    assert len(world.records("owner_reply")) == 5  # a held press writes nothing


# -- where the route is not ----------------------------------------------------------------------


def test_without_public_url_no_buttons_and_the_route_is_404(
    tmp_path: Path, emu: NtfyEmulator
) -> None:
    conn = db.connect(store_of(tmp_path))
    migrations.apply(conn)
    incident(conn, "alerts:disk")
    world = World(conn, tmp_path, emu)
    assert owner_buttons.attach(world.sender, world.queue, None) is None
    try:
        with world.log:
            assert world.message("d1", "alerts:disk") == "queued"
            world.send()
            [message] = world.published()
            assert "actions" not in message
            with _serve.serving(world.app(owner_actions.routes(None))) as url:
                answer = httpx.post(f"{url}/v1/owner/buttons/ack", content=b"x.y", timeout=10)
        assert answer.status_code == 404
    finally:
        conn.close()


def test_standby_refuses_a_press_naming_the_leader(tmp_path: Path) -> None:
    routes = owner_actions.routes(None, leader=lambda: "http://node-a.lan:8788/console")
    app = http_api.create_app(
        db_path=store_of(tmp_path),
        token=None,
        notify=None,
        health=lambda: (True, {}),
        metrics_snapshot=dict,
        extra_routes=routes,
    )
    with _serve.serving(app) as url:
        answer = httpx.post(f"{url}/v1/owner/buttons/ack", content=b"x.y", timeout=10)
        unknown = httpx.post(f"{url}/v1/owner/buttons/reboot", content=b"x.y", timeout=10)
    assert answer.status_code == 503
    assert answer.json()["error"] == "standby"
    assert "node-a.lan" in answer.json()["message"]
    assert unknown.status_code == 404


def test_press_under_a_foreign_host_name_is_refused_before_the_token(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    answer = httpx.post(ack["url"], content=ack["body"].encode(), headers={"Host": "evil.example"})
    assert answer.status_code == 421
    assert world.records("owner_reply") == []
    assert press(ack).status_code == 200


def test_get_on_a_button_is_not_an_action(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    assert httpx.get(ack["url"], timeout=10).status_code == 405
    assert world.message("d2", "alerts:disk") == "queued"


def test_a_token_made_by_one_node_is_accepted_by_the_other(world: World) -> None:
    """Failure mode: after a failover the new leader holds a key of its own, and every button
    on the owner's phone answers 403. Two nodes: two connections to one store, each with its
    own buttons (nothing cached), as a standby pair on one PostgreSQL database."""
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()  # node A signs
    ack = world.buttons_of("alerts:disk")["Ack"]
    other = db.connect(store_of(world.tmp_path))
    try:
        node_b = owner_buttons.OwnerButtons(
            other,
            run_db=world.run_db,
            queue=world.queue,
            public_url=world.url,
            clock=world.clock,
            flush_audit=world.flush,
        )
        pressed = asyncio.run(node_b.press("ack", ack["body"], "192.0.2.7"))
    finally:
        other.close()
    assert (pressed.status, pressed.body["result"]) == (200, "acknowledged")
    assert world.message("d2", "alerts:disk") == "suppressed"


def test_oversized_body_is_refused_as_malformed_and_counted(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    answer = press(ack, body="A" * 100_000)
    assert answer.status_code == 403
    assert answer.json()["why"] == "malformed"
    [line] = world.records("owner_reply")
    assert (line["result"], line["why"]) == ("refused", "malformed")
    assert press(ack).status_code == 200
