"""WebSocket subscribe (`/<topics>/ws`) as ntfy v2.13 does it, and as aiontfy and Home Assistant
use it: aiontfy first GETs `/<topics>/auth`, then connects to `ws://.../<topics>/ws` with its
filters as query parameters and its auth headers (checked against a real server by hand)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.sync.client import connect
from websockets.uri import parse_uri

from ntfy_intake.emulator import NtfyEmulator


class RawWebSocket:
    """A WebSocket client that shows every frame, pings included (sans-I/O websockets)."""

    def __init__(self, base_url: str, target: str) -> None:
        url = httpx.URL(base_url)
        self.protocol = ClientProtocol(parse_uri(f"ws://{url.host}:{url.port}{target}"))
        self.sock = socket.create_connection((url.host, url.port), timeout=5)
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        self.response: Response | None = None
        self.closed = False

    def _flush(self) -> None:
        data = b"".join(self.protocol.data_to_send())
        if data:
            self.sock.sendall(data)

    def frames(self, seconds: float) -> list[Frame]:
        frames: list[Frame] = []
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0 and not self.closed:
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            if data:
                self.protocol.receive_data(data)
            else:
                self.protocol.receive_eof()
                self.closed = True
            for event in self.protocol.events_received():
                if isinstance(event, Response):
                    self.response = event
                else:
                    frames.append(event)
            self._flush()
        return frames

    def close(self) -> None:
        self.sock.close()


def _texts(frames: list[Frame]) -> list[dict[str, Any]]:
    out = []
    for frame in frames:
        if frame.opcode == Opcode.TEXT:
            text = bytes(frame.data).decode()
            assert text.endswith("\n")  # gorilla's WriteJSON
            out.append(json.loads(text))
    return out


@pytest.fixture
def ws_url(emu: NtfyEmulator) -> str:
    return emu.url.replace("http://", "ws://")


def test_ws_sends_open_then_replay_then_live_as_json_text_frames(
    emu: NtfyEmulator, ws_url: str
) -> None:
    before = emu.publish("t", "before")
    with connect(f"{ws_url}/t/ws?since=all", open_timeout=5) as ws:
        opened = json.loads(ws.recv(timeout=5))
        assert list(opened) == ["id", "time", "event", "topic"]
        assert (opened["event"], opened["topic"]) == ("open", "t")
        assert json.loads(ws.recv(timeout=5))["id"] == before["id"]
        emu.wait_for_subscribers(1, topic="t")
        live = emu.publish("t", "live")
        assert json.loads(ws.recv(timeout=5))["id"] == live["id"]


def test_ws_frames_carry_sequence_id_even_when_equal_to_id_on_2_17_only(
    make_emulator: Callable[..., NtfyEmulator],
) -> None:
    for version, expected in (("2.17", True), ("2.13", False)):
        emu = make_emulator(ntfy_version=version)
        sent = emu.publish("t", "x")
        assert "sequence_id" not in sent  # json form: left out when equal to id
        with connect(f"{emu.url.replace('http', 'ws')}/t/ws?poll=1", open_timeout=5) as ws:
            frame = json.loads(ws.recv(timeout=5))
        assert ("sequence_id" in frame) is expected
        if expected:
            assert frame["sequence_id"] == frame["id"]


def test_ws_pings_every_keepalive_interval_and_sends_no_keepalive_events(
    make_emulator: Callable[..., NtfyEmulator],
) -> None:
    emu = make_emulator(keepalive_interval=0.3)
    ws = RawWebSocket(emu.url, "/t/ws")
    try:
        frames = ws.frames(1.4)
    finally:
        ws.close()
    assert ws.response is not None and ws.response.status_code == 101
    assert [event["event"] for event in _texts(frames)] == ["open"]
    assert sum(1 for frame in frames if frame.opcode == Opcode.PING) >= 3


def test_ws_poll_sends_the_replay_and_closes_without_a_close_frame(
    emu: NtfyEmulator,
) -> None:
    first = emu.publish("t", "one")
    ws = RawWebSocket(emu.url, "/t/ws?poll=1")
    try:
        frames = ws.frames(3.0)
    finally:
        ws.close()
    assert [event["id"] for event in _texts(frames)] == [first["id"]]
    assert ws.closed
    assert not any(frame.opcode == Opcode.CLOSE for frame in frames)


@pytest.mark.parametrize(
    ("target", "status"),
    [("/app/t/ws", 404), ("/app/ws", 400), ("/t/ws?since=bogus", 400), ("/t/ws?priority=9", 400)],
)
def test_ws_handshake_errors_are_a_bare_status(ws_url: str, target: str, status: int) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{ws_url}{target}", open_timeout=5)
    response = refused.value.response
    assert (response.status_code, response.body) == (status, b"")


def test_ws_auth_errors_are_bare_401_and_403(
    make_emulator: Callable[..., NtfyEmulator],
) -> None:
    token = "tk_" + "a" * 29
    emu = make_emulator(tokens={token: {"mine"}})
    ws_url = emu.url.replace("http", "ws")
    for target, headers, status in (
        ("/mine/ws", {}, 403),
        ("/mine/ws", {"Authorization": "Bearer tk_" + "b" * 29}, 401),
        ("/other/ws", {"Authorization": f"Bearer {token}"}, 403),
    ):
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{ws_url}{target}", additional_headers=headers, open_timeout=5)
        assert (refused.value.response.status_code, refused.value.response.body) == (status, b"")
    with connect(
        f"{ws_url}/mine/ws", additional_headers={"Authorization": f"Bearer {token}"}
    ) as ws:
        assert json.loads(ws.recv(timeout=5))["event"] == "open"


def test_get_ws_without_upgrade_is_40016_json(client: httpx.Client) -> None:
    response = client.get("/t/ws")
    assert response.status_code == 400
    assert response.json() == {
        "code": 40016,
        "http": 400,
        "error": "invalid request: client not using the websocket protocol",
        "link": "https://ntfy.sh/docs/subscribe/api/#websockets",
    }


def test_aiontfy_subscribe_sequence(emu: NtfyEmulator, ws_url: str) -> None:
    """aiontfy 0.8 `Ntfy.subscribe(["a", "b"], cb, title=..., priority=[4, 5])`: GET /a,b/auth,
    then ws /a,b/ws?title=...&priority=4,5; filters apply to live messages."""
    auth = httpx.get(f"{emu.url}/a,b/auth")
    assert auth.json() == {"success": True}
    with connect(f"{ws_url}/a,b/ws?title=Alarm&priority=4,5", open_timeout=5) as ws:
        assert json.loads(ws.recv(timeout=5))["topic"] == "a,b"
        emu.wait_for_subscribers(1, topic="b")
        emu.publish("a", "quiet", title="Alarm", priority=2)
        wanted = emu.publish("b", "loud", title="Alarm", priority=5)
        assert json.loads(ws.recv(timeout=5))["id"] == wanted["id"]


def test_ws_counts_against_the_subscription_limit(
    make_emulator: Callable[..., NtfyEmulator],
) -> None:
    emu = make_emulator(subscription_limit=1)
    ws_url = emu.url.replace("http", "ws")
    with connect(f"{ws_url}/t/ws", open_timeout=5) as ws:
        assert json.loads(ws.recv(timeout=5))["event"] == "open"
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{ws_url}/t/ws", open_timeout=5)
        assert refused.value.response.status_code == 429


def test_ws_answers_client_pings_as_aiontfys_heartbeat_needs(emu: NtfyEmulator) -> None:
    """aiontfy connects with heartbeat=60: it pings and closes the socket if no pong comes."""
    ws = RawWebSocket(emu.url, "/t/ws")
    try:
        assert [event["event"] for event in _texts(ws.frames(0.5))] == ["open"]
        ws.protocol.send_ping(b"hb")
        ws._flush()
        frames = ws.frames(1.0)
    finally:
        ws.close()
    assert [(frame.opcode, bytes(frame.data)) for frame in frames] == [(Opcode.PONG, b"hb")]


def test_ws_client_frame_over_64_bytes_ends_the_connection(emu: NtfyEmulator, ws_url: str) -> None:
    """ntfy's wsReadLimit: clients should send nothing; a large frame drops the connection."""
    with connect(f"{ws_url}/t/ws", open_timeout=5) as ws:
        assert json.loads(ws.recv(timeout=5))["event"] == "open"
        ws.send("x" * 65)
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
