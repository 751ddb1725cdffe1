"""The libraries homelab users publish and subscribe with, against both servers: Apprise and
python-ntfy (dev dependencies), and aiontfy's requests reproduced from its source (aiontfy needs
Python 3.12). Whatever the real server accepts, the emulator accepts the same way.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from urllib.parse import quote, urlsplit

import apprise
import httpx
from python_ntfy import NtfyClient

from ..servers import Server

MakeServer = Callable[..., Server]


def cached(server: Server, topic: str, **params: str) -> list[dict[str, object]]:
    return server.poll(f"/{topic}/json", **params)


def test_python_ntfy_send_with_actions_markdown_and_poll(server: Server) -> None:
    client = NtfyClient(topic="pyntfy", server=server.url)
    sent = client.send(
        message="**disk** almost full",
        title="NAS",
        priority=NtfyClient.MessagePriority.HIGH,
        tags=["warning", "disk"],
        actions=[NtfyClient.ViewAction(label="Open", url="https://nas.example/")],
        format_as_markdown=True,
    )
    assert (sent["title"], sent["priority"], sent["tags"]) == ("NAS", 4, ["warning", "disk"])
    assert sent["content_type"] == "text/markdown"
    assert sent["actions"][0]["label"] == "Open"
    (polled,) = client.get_cached_messages(since="all")
    assert polled == sent


def test_python_ntfy_scheduled_send_is_listed_only_with_scheduled(server: Server) -> None:
    client = NtfyClient(topic="pyntfy-later", server=server.url)
    when = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    sent = client.send(message="later", schedule=when)
    assert abs(sent["time"] - int(when.timestamp())) <= 1
    assert client.get_cached_messages(since="all") == []
    assert [m["id"] for m in client.get_cached_messages(since="all", scheduled=True)] == [
        sent["id"]
    ]


def test_python_ntfy_token_auth_as_basic_with_an_empty_user(make_server: MakeServer) -> None:
    server = make_server(auth={"reader": ["pyauth"]})
    server.publish("pyauth", "secret")
    client = NtfyClient(topic="pyauth", server=server.url, auth=server.tokens["reader"])
    assert [m["message"] for m in client.get_cached_messages(since="all")] == ["secret"]


def apprise_url(server: Server, topic: str, **options: str) -> str:
    host = urlsplit(server.url).netloc
    query = "&".join(f"{key}={quote(value, safe='')}" for key, value in options.items())
    return f"ntfy://{host}/{topic}" + (f"?{query}" if query else "")


def test_apprise_json_publish_with_headers(server: Server) -> None:
    notifier = apprise.Apprise()
    assert notifier.add(
        apprise_url(
            server,
            "apprise",
            priority="high",
            tags="warning,disk",
            click="https://nas.example/",
            actions="view, Open portal, https://nas.example/portal",
            image="no",
        )
    )
    assert notifier.notify(title="NAS", body="disk almost full")
    (event,) = cached(server, "apprise")
    assert (event["title"], event["message"], event["priority"]) == (
        "NAS",
        "disk almost full",
        4,
    )
    assert sorted(event["tags"]) == ["disk", "warning"]  # Apprise sorts them
    assert event["click"] == "https://nas.example/"
    actions = event["actions"]
    assert isinstance(actions, list) and actions[0]["label"] == "Open portal"


def test_apprise_scheduled_delivery(server: Server) -> None:
    notifier = apprise.Apprise()
    assert notifier.add(apprise_url(server, "apprise-later", delay="30m", image="no"))
    assert notifier.notify(body="later")
    assert cached(server, "apprise-later") == []
    (event,) = cached(server, "apprise-later", scheduled="1")
    assert abs(int(str(event["time"])) - (int(time.time()) + 1800)) <= 2


def test_aiontfy_requests_account_and_json_publish(server: Server) -> None:
    """aiontfy's `account()` (Home Assistant calls it at set-up) and its JSON publish."""
    with httpx.Client(base_url=server.url, timeout=10) as http:
        account = http.get("/v1/account")
        assert account.status_code == 200 and account.json()["role"] == "anonymous"
        published = http.post(
            "/",
            json={
                "topic": "aiontfy",
                "message": "from home assistant",
                "title": "HA",
                "priority": 4,
                "tags": ["house"],
                "click": "https://ha.example/",
                "actions": [{"action": "view", "label": "Open", "url": "https://ha.example/"}],
                "delay": "10m",
            },
        )
        assert published.status_code == 200, published.text
        event = published.json()
        assert event["time"] >= int(time.time()) + 590
        assert event["actions"][0]["url"] == "https://ha.example/"
