"""Action buttons, attachment by URL, icon, click, markdown and e-mail as ntfy serialises them.

Every expected value below was captured from a real ntfy v2.13 server (curl, docs/emulator.md);
only the random ids differ, so ids are checked by shape and then dropped."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

_ACTIONS_LINK = "https://ntfy.sh/docs/publish/#action-buttons"


def _without_action_ids(event: dict[str, Any]) -> list[dict[str, Any]]:
    actions = event["actions"]
    for action in actions:
        assert re.fullmatch(r"[A-Za-z0-9]{10}", action.pop("id"))
    return actions


@pytest.mark.parametrize(
    ("header", "value", "expected"),
    [
        (
            "Actions",
            "view, Open portal, https://example.com/x, clear=true",
            [
                {
                    "action": "view",
                    "label": "Open portal",
                    "clear": True,
                    "url": "https://example.com/x",
                }
            ],
        ),
        (
            "X-Actions",
            'http, "Close, door", https://api.x/y, method=put, headers.Authorization=Bearer z, '
            'body={"a":1}; broadcast, Take pic, extras.cmd=pic, extras.camera=front; '
            "view, L, https://e",
            [
                {
                    "action": "http",
                    "label": "Close, door",
                    "clear": False,
                    "url": "https://api.x/y",
                    "method": "PUT",
                    "headers": {"Authorization": "Bearer z"},
                    "body": '{"a":1}',
                },
                {
                    "action": "broadcast",
                    "label": "Take pic",
                    "clear": False,
                    "extras": {"camera": "front", "cmd": "pic"},
                },
                {"action": "view", "label": "L", "clear": False, "url": "https://e"},
            ],
        ),
        (
            "Action",
            "http, Hit, https://e",
            [{"action": "http", "label": "Hit", "clear": False, "url": "https://e"}],
        ),
        (
            "Actions",
            '[{"action":"view","label":"Open","url":"https://e","clear":true},'
            '{"action":"HTTP","label":"h","url":"https://x","method":"get"}]',
            [
                {"action": "view", "label": "Open", "clear": True, "url": "https://e"},
                {
                    "action": "http",
                    "label": "h",
                    "clear": False,
                    "url": "https://x",
                    "method": "GET",
                },
            ],
        ),
    ],
)
def test_action_headers_give_ntfys_actions(
    client: httpx.Client, header: str, value: str, expected: list[dict[str, Any]]
) -> None:
    response = client.post("/act", content=b"hi", headers={header: value})
    assert response.status_code == 200, response.text
    event = response.json()
    assert _without_action_ids(event) == expected
    assert list(event) == ["id", "time", "expires", "event", "topic", "message", "actions"]
    replayed = client.get("/act/json", params={"poll": "1", "id": event["id"]}).json()
    assert replayed["actions"][0]["id"] == response.json()["actions"][0]["id"]


def test_json_publish_actions(client: httpx.Client) -> None:
    response = client.post(
        "/",
        json={
            "topic": "act",
            "message": "m",
            "actions": [
                {"action": "broadcast", "label": "B", "extras": {"z": "1", "a": "2"}},
                {"Action": "view", "Label": "V", "URL": "https://v"},
            ],
        },
    )
    assert _without_action_ids(response.json()) == [
        {"action": "broadcast", "label": "B", "clear": False, "extras": {"a": "2", "z": "1"}},
        {"action": "view", "label": "V", "clear": False, "url": "https://v"},
    ]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("foo, L, https://e", "term 'https://e' unknown"),
        (
            "view, a, https://e; view, b, https://e; view, c, https://e; view, d, https://e",
            "only 3 actions allowed",
        ),
        ("view", "parameter 'label' is required"),
        (
            "view, L, https://e, clear=maybe",
            "parameter 'clear' cannot be 'maybe', only boolean values are allowed "
            "(true/yes/1/false/no/0)",
        ),
        ("view, L, https://e, foo=bar", "key 'foo' unknown"),
        (
            "http, L, https://e, method=GET, body=x",
            "parameter 'body' cannot be set if method is GET",
        ),
        ("broadcast, L, extra", "term 'extra' unknown"),
        ("view, L", "parameter 'url' is required for action 'view'"),
    ],
)
def test_bad_actions_get_40018_with_ntfys_reason(
    client: httpx.Client, value: str, reason: str
) -> None:
    response = client.post("/act", content=b"hi", headers={"Action": value})
    assert response.status_code == 400
    assert response.json() == {
        "code": 40018,
        "http": 400,
        "error": f"invalid request: actions invalid; {reason}",
        "link": _ACTIONS_LINK,
    }


def test_json_actions_of_the_wrong_type_are_40024_and_bad_kinds_40018(
    client: httpx.Client,
) -> None:
    wrong_type = client.post(
        "/",
        json={"topic": "act", "actions": [{"action": "view", "label": "V", "clear": "yes"}]},
    )
    assert wrong_type.json()["code"] == 40024
    bad_kind = client.post(
        "/", json={"topic": "act", "actions": [{"action": "viewx", "label": "V"}]}
    )
    assert bad_kind.json()["error"] == (
        "invalid request: actions invalid; parameter 'action' cannot be 'viewx', valid values "
        "are 'view', 'broadcast' and 'http'"
    )
    broken = client.post("/act", content=b"x", headers={"Actions": '[{"action":"view",'})
    assert broken.json()["code"] == 40018
    assert broken.json()["error"].startswith("invalid request: actions invalid; JSON error: ")


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        (
            {"X-Attach": "https://example.com/files/report.pdf"},
            b"",
            {
                "message": "You received a file: report.pdf",
                "attachment": {"name": "report.pdf", "url": "https://example.com/files/report.pdf"},
            },
        ),
        (
            {"Attach": "https://example.com/files/report.pdf", "X-Filename": "r.pdf"},
            b"see",
            {
                "message": "see",
                "attachment": {"name": "r.pdf", "url": "https://example.com/files/report.pdf"},
            },
        ),
        (
            {"Attach": "https://example.com/"},
            b"",
            {
                "message": "You received a file: attachment",
                "attachment": {"name": "attachment", "url": "https://example.com/"},
            },
        ),
        (
            {"X-Icon": "https://e/i.png", "X-Click": "https://e/c"},
            b"x",
            {"message": "x", "click": "https://e/c", "icon": "https://e/i.png"},
        ),
        ({"Click": "notaurl"}, b"x", {"message": "x", "click": "notaurl"}),
        ({"X-Markdown": "yes"}, b"**b**", {"message": "**b**", "content_type": "text/markdown"}),
        (
            {"Content-Type": "text/markdown"},
            b"**b**",
            {"message": "**b**", "content_type": "text/markdown"},
        ),
    ],
)
def test_attachment_icon_click_markdown_fields(
    client: httpx.Client, headers: dict[str, str], body: bytes, expected: dict[str, Any]
) -> None:
    event = client.put("/att", content=body, headers=headers).json()
    for key in ("id", "time", "expires", "event", "topic"):
        event.pop(key)
    assert event == expected


def test_json_attach_icon_click_markdown_in_ntfys_key_order(client: httpx.Client) -> None:
    event = client.post(
        "/",
        json={
            "topic": "att",
            "message": "m",
            "attach": "https://e/f.jpg",
            "filename": "x.jpg",
            "icon": "https://e/i",
            "click": "https://c",
            "markdown": True,
        },
    ).json()
    assert list(event)[5:] == ["message", "click", "icon", "attachment", "content_type"]
    assert event["attachment"] == {"name": "x.jpg", "url": "https://e/f.jpg"}


@pytest.mark.parametrize(
    ("request_kwargs", "code"),
    [
        ({"headers": {"X-Email": "a@b.c"}}, 40001),  # no SMTP configured, as on a default ntfy
        ({"headers": {"Attach": "ftp://example.com/x"}}, 40013),
        ({"headers": {"Filename": "a.txt"}}, 40014),  # an upload: attachments not configured
        ({"headers": {"X-Call": "+1234"}}, 40032),
    ],
)
def test_unconfigured_features_answer_as_a_default_ntfy(
    client: httpx.Client, request_kwargs: dict[str, Any], code: int
) -> None:
    assert client.put("/att", content=b"x", **request_kwargs).json()["code"] == code
