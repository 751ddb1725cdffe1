"""What publishers send, against both servers: scheduled delivery, action buttons, attachments by
URL, icons, markdown, UnifiedPush's base64 bodies, and the account and stats endpoints that
clients such as Home Assistant's ntfy integration call at set-up.

Expected values are what the real ntfy server answers (checked against its source, v2.13).
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from ntfy_intake.wire import owner_channels

from ..servers import Server


@pytest.mark.slow  # ntfy's shortest delay is 10 s, waited out in real time on both servers
def test_item20_scheduled_message_is_invisible_until_delivered_then_timed_at_delivery(
    server: Server,
) -> None:
    """A scheduled message keeps its publish-time row: a cursor taken after scheduling skips it.

    This is the loss window the overlap backfill closes (DESIGN.md section 3)."""
    scheduled = server.publish("t", "later", Delay="10s")
    assert scheduled["time"] >= int(time.time()) + 9
    after = server.publish("t", "meanwhile")
    assert [e["id"] for e in server.poll("/t/json", since="all")] == [after["id"]]
    assert scheduled["id"] in {e["id"] for e in server.poll("/t/json", scheduled="1")}
    deadline = time.monotonic() + 30  # due in 10 s; ntfy's delayed sender runs every 10 s
    while scheduled["id"] not in {e["id"] for e in server.poll("/t/json", since="all")}:
        assert time.monotonic() < deadline, "the scheduled message was never delivered"
        time.sleep(0.5)
    (delivered,) = [e for e in server.poll("/t/json", since="all") if e["id"] == scheduled["id"]]
    assert delivered["time"] == scheduled["time"]
    # Row order is by publish: a cursor on `meanwhile` never sees the scheduled message.
    assert scheduled["id"] not in {e["id"] for e in server.poll("/t/json", since=after["id"])}
    # Time order finds it: `since=<time>` is inclusive and reads the delivery time.
    found = server.poll("/t/json", since=str(scheduled["time"]))
    assert scheduled["id"] in {e["id"] for e in found}


@pytest.mark.parametrize(
    ("header", "value", "offset"),
    [("In", "30m", 1800), ("X-Delay", "1h", 3600), ("At", "+7200", 7200)],
)
def test_scheduled_forms_set_the_future_time(
    server: Server, header: str, value: str, offset: int
) -> None:
    if value.startswith("+"):
        value = str(int(time.time()) + int(value[1:]))
    sent = server.publish("t", "later", **{header: value})
    assert abs(sent["time"] - (int(time.time()) + offset)) <= 2
    assert sent["expires"] - sent["time"] == 43200


@pytest.mark.parametrize(("value", "code"), [("5s", 40005), ("4d", 40006), ("banana", 40004)])
def test_scheduled_delay_errors(server: Server, value: str, code: int) -> None:
    response = server.put("t", "x", Delay=value)
    assert (response.status_code, response.json()["code"]) == (400, code)


def test_action_buttons_by_header_and_by_json(server: Server) -> None:
    sent = server.publish(
        "t",
        "act",
        Actions="view, Open portal, https://home.example/, clear=true; "
        'http, Reboot, https://api.example/reboot, method=PUT, body={"a":1}',
    )
    view, http = sent["actions"]
    assert len(view.pop("id")) == 10 and len(http.pop("id")) == 10
    assert view == {
        "action": "view",
        "label": "Open portal",
        "clear": True,
        "url": "https://home.example/",
    }
    assert http == {
        "action": "http",
        "label": "Reboot",
        "clear": False,
        "url": "https://api.example/reboot",
        "method": "PUT",
        "body": '{"a":1}',
    }
    posted = httpx.post(
        server.url,
        json={
            "topic": "t",
            "message": "j",
            "actions": [{"action": "view", "label": "L", "url": "https://x.example"}],
        },
        timeout=10,
    )
    assert posted.status_code == 200, posted.text
    (action,) = posted.json()["actions"]
    assert {k: v for k, v in action.items() if k != "id"} == {
        "action": "view",
        "label": "L",
        "clear": False,
        "url": "https://x.example",
    }
    replayed = {e["id"]: e for e in server.poll("/t/json")}
    assert replayed[sent["id"]]["actions"][0]["label"] == "Open portal"


@pytest.mark.parametrize(
    "public_url",
    [
        "http://127.0.0.1:8788",
        "https://pi.home.example/intake/",
        "http://[fe80::1%25eth0]:8788/a,b;c=d'e",
    ],
)
def test_owner_button_actions_header_is_read_back_unchanged(
    server: Server, public_url: str
) -> None:
    """The daemon's own `Actions` header (flow/owner_buttons.py via wire/owner_channels): the
    buttons' URLs and tokens as ntfy stores them, byte for byte, on both servers; a value it
    cannot write so (a quote, non-ASCII) sends no header at all rather than a mangled one."""
    token = "MQphY2sKMTc2NTAwMDAwMAp0cmk.AbC-_dEf"
    buttons = [
        (label, owner_channels.button_url(public_url, action), token)
        for action, label in (("ack", "Ack"), ("silence_2h", "Silence 2h"))
    ]
    header = owner_channels.actions_header(buttons)
    assert header is not None
    sent = server.publish("buttons", "disk full", Actions=header)
    got = [
        (a["action"], a["label"], a["url"], a["method"], a["body"], a["clear"])
        for a in sent["actions"]
    ]
    assert got == [("http", label, url, "POST", body, True) for label, url, body in buttons]
    (polled,) = server.poll("/buttons/json", since="all")
    assert polled["actions"] == sent["actions"]
    assert owner_channels.actions_header([("Ack", 'http://x/"q', token)]) is None
    assert owner_channels.actions_header([("Ack", "http://bücher.example/", token)]) is None


def test_attachment_by_url_click_icon_and_markdown(server: Server) -> None:
    attached = server.publish("t", "att", Attach="https://example.com/file.jpg")
    assert attached["attachment"] == {"name": "file.jpg", "url": "https://example.com/file.jpg"}
    styled = server.publish(
        "t", "**md**", Markdown="yes", Icon="https://e.example/i.png", Click="https://e.example"
    )
    assert list(styled)[5:] == ["message", "click", "icon", "content_type"]
    assert styled["content_type"] == "text/markdown"


def test_binary_body_is_40014_without_attachments_and_base64_for_unifiedpush(
    server: Server,
) -> None:
    binary = b"\xff\xfe\x00bin"
    refused = server.put("t", binary)
    assert (refused.status_code, refused.json()["code"]) == (400, 40014)
    pushed = httpx.put(f"{server.url}/t?up=1", content=binary, timeout=10).json()
    assert (pushed["message"], pushed["encoding"]) == ("//4AYmlu", "base64")
    plain = httpx.put(f"{server.url}/t?up=1", content=b"plain text", timeout=10).json()
    assert plain["message"] == "plain text" and "encoding" not in plain


def test_anonymous_account_and_stats(server: Server) -> None:
    server.publish("t", "counted")
    account = server.get("/v1/account")
    assert account.status_code == 200
    body = account.json()
    assert (body["username"], body["role"]) == ("*", "anonymous")
    assert {"limits", "stats"} <= set(body)
    stats = server.get("/v1/stats").json()
    assert set(stats) == {"messages", "messages_rate"}
    assert isinstance(stats["messages"], int)


def test_item04_websocket_subscribe_sends_json_events_and_no_keepalive_json(
    server: Server,
) -> None:
    """aiontfy and Home Assistant subscribe over /ws: open, the replay, then live, as JSON."""
    cached_first = server.publish("t", "cached")
    url = server.url.replace("http://", "ws://") + "/t/ws?since=all"
    with connect(url, open_timeout=10) as socket:
        opened = json.loads(socket.recv(timeout=10))
        replayed = json.loads(socket.recv(timeout=10))
        live_sent = server.publish("t", "live")
        live = json.loads(socket.recv(timeout=10))
    assert (opened["event"], opened["topic"]) == ("open", "t")
    assert replayed["id"] == cached_first["id"]
    assert (live["id"], live["message"]) == (live_sent["id"], "live")
