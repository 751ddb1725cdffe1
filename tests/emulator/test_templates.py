"""`?template=alertmanager` and `?template=grafana`: the emulator renders a webhook's JSON body as
ntfy >= 2.14 does.

The expected titles and messages below are what ntfy's embedded templates produce for these
payloads: `server/templates/alertmanager.yml` and `server/templates/grafana.yml` of
binwiederhier/ntfy (commit ae62e0d, the v2.14 templating work; unchanged since), rendered by
`renderTemplateFromFile`/`renderTemplate` (message first, then title; each trimmed, a literal
`\\n` made a newline). They were checked against Go's own text/template running those files;
where the real server can run, `test_the_real_server_renders_the_same` compares byte for byte.

Lines of the templates that decide the expected text:
- alertmanager.yml, title: `{{- if eq .status "firing" }}` -> "🚨 Alert: " and the first alert's
  alertname; `"resolved"` -> "✅ Resolved: "; any other status -> `fail` (400, 40045).
- alertmanager.yml, message: "Status: {{ .status | title }}", "Receiver:", then per alert
  "Alert/Instance/Severity/Starts at", `{{- if .endsAt }}Ends at: ...` (the `-` eats the newline
  and Alertmanager's firing endsAt "0001-01-01T00:00:00Z" is non-empty: ntfy issue #1940),
  "Summary:" and "Description:" only when set, "Source:" and a blank line.
- grafana.yml: title "🚨 {{ .title | default "Alert firing" }}" / "✅ ... "Alert resolved"" /
  "⚠️ Unknown alert: ..."; message `{{ .message | trunc 2000 }}` (2000 bytes).
Payloads: Alertmanager's webhook body (`notify/webhook` Message: version 4, groupKey, status,
receiver, groupLabels, commonLabels, commonAnnotations, externalURL, alerts[]), Grafana's
webhook contact point body (its `title`, `message`, `state`, `status` and `alerts[]`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ntfy_intake.testbed.emulator import NtfyEmulator, templates
from ntfy_intake.testbed.emulator.wire import NtfyError

from ..real_ntfy import RealNtfy

ZERO = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert in a notification


def _am_alert(name: str, status: str, ends_at: str, **annotations: str) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": name, "instance": "nas:9100", "severity": "critical"},
        "annotations": annotations,
        "startsAt": "2026-12-06T17:00:00.123Z",
        "endsAt": ends_at,
        "generatorURL": "http://prometheus:9090/graph?g0.expr=up+%3D%3D+0",
        "fingerprint": "5ba4e7f6a1e06c39",
    }


def alertmanager_body(status: str, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "receiver": "ntfy",
        "status": status,
        "alerts": alerts,
        "groupLabels": {"alertname": alerts[0]["labels"]["alertname"]},
        "commonLabels": {"severity": "critical"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": '{}:{alertname="NodeDown"}',
        "truncatedAlerts": 0,
    }


AM_FIRING = alertmanager_body(
    "firing", [_am_alert("NodeDown", "firing", ZERO, summary="nas is down")]
)
AM_RESOLVED = alertmanager_body(
    "resolved",
    [
        _am_alert(
            "NodeDown",
            "resolved",
            "2026-12-06T17:05:00Z",
            summary="nas is down",
            description="no scrape for 5m",
        ),
        _am_alert("DiskFull", "resolved", "2026-12-06T17:05:00Z"),
    ],
)


def grafana_body(status: str, title: str, message: str) -> dict[str, Any]:
    return {
        "receiver": "ntfy",
        "status": status,
        "orgId": 1,
        "alerts": [
            {
                "status": status,
                "labels": {"alertname": "Load high", "instance": "nas:9100"},
                "annotations": {"summary": "load above 8"},
                "startsAt": "2026-12-06T17:00:00Z",
                "endsAt": ZERO if status == "firing" else "2026-12-06T17:10:00Z",
                "values": {"B": 9.25, "C": 1},
            }
        ],
        "groupLabels": {"alertname": "Load high"},
        "externalURL": "http://grafana:3000/",
        "version": "1",
        "title": title,
        "state": "alerting" if status == "firing" else "ok",
        "message": message,
    }


GRAFANA_FIRING = grafana_body(
    "firing", "[FIRING:1] Load high (nas:9100)", "**Firing**\n\nValue: B=9.25, C=1\n"
)
GRAFANA_RESOLVED = grafana_body("resolved", "", "**Resolved**\n\nValue: B=2.5, C=0\n")

# (template, body, title, message): ntfy's rendering of each.
GOLDEN = [
    (
        "alertmanager",
        AM_FIRING,
        "🚨 Alert: NodeDown",
        "Status: Firing\nReceiver: ntfy\nAlert: NodeDown\nInstance: nas:9100\n"
        "Severity: critical\nStarts at: 2026-12-06T17:00:00.123ZEnds at: 0001-01-01T00:00:00Z\n"
        "Summary: nas is down\nSource: http://prometheus:9090/graph?g0.expr=up+%3D%3D+0",
    ),
    (
        "alertmanager",
        AM_RESOLVED,
        "✅ Resolved: NodeDown",
        "Status: Resolved\nReceiver: ntfy\nAlert: NodeDown\nInstance: nas:9100\n"
        "Severity: critical\nStarts at: 2026-12-06T17:00:00.123ZEnds at: 2026-12-06T17:05:00Z\n"
        "Summary: nas is down\nDescription: no scrape for 5m\n"
        "Source: http://prometheus:9090/graph?g0.expr=up+%3D%3D+0\n\n\n"
        "Alert: DiskFull\nInstance: nas:9100\nSeverity: critical\n"
        "Starts at: 2026-12-06T17:00:00.123ZEnds at: 2026-12-06T17:05:00Z\n"
        "Source: http://prometheus:9090/graph?g0.expr=up+%3D%3D+0",
    ),
    (
        "grafana",
        GRAFANA_FIRING,
        "🚨 [FIRING:1] Load high (nas:9100)",
        "**Firing**\n\nValue: B=9.25, C=1",
    ),
    ("grafana", GRAFANA_RESOLVED, "✅ Alert resolved", "**Resolved**\n\nValue: B=2.5, C=0"),
]
IDS = ["alertmanager-firing", "alertmanager-resolved", "grafana-firing", "grafana-resolved"]


@pytest.mark.parametrize(("name", "body", "title", "message"), GOLDEN, ids=IDS)
def test_a_named_template_renders_as_ntfy_does(
    name: str, body: dict[str, Any], title: str, message: str
) -> None:
    rendered = templates.render(name, json.dumps(body).encode(), 4096)
    assert (rendered.title, rendered.message) == (title, message)


@pytest.mark.parametrize(("name", "body", "title", "message"), GOLDEN, ids=IDS)
def test_a_webhook_post_publishes_the_rendered_message(
    client: httpx.Client, name: str, body: dict[str, Any], title: str, message: str
) -> None:
    """Alertmanager and Grafana POST their JSON to `/<topic>?template=<name>`; the event carries
    the rendered title and message, no tags, the default priority, and is what a poll replays."""
    response = client.post(f"/alerts?template={name}", content=json.dumps(body))
    assert response.status_code == 200, response.text
    event = response.json()
    assert (event["title"], event["message"]) == (title, message)
    assert "tags" not in event and "priority" not in event
    polled = [json.loads(line) for line in client.get("/alerts/json?poll=1").text.splitlines()]
    assert [(e["title"], e["message"]) for e in polled] == [(title, message)]


def test_tags_and_priority_from_the_url_are_kept(client: httpx.Client) -> None:
    """The templates set only title and message: `X-Tags`/`X-Priority` stay the publisher's."""
    response = client.post(
        "/alerts?template=alertmanager&tags=prometheus&priority=5", content=json.dumps(AM_FIRING)
    )
    event = response.json()
    assert (event["tags"], event["priority"], event["title"]) == (
        ["prometheus"],
        5,
        "🚨 Alert: NodeDown",
    )


def _error(name: str, body: bytes, size_limit: int = 4096) -> NtfyError:
    with pytest.raises(NtfyError) as caught:
        templates.render(name, body, size_limit)
    return caught.value


def test_an_unknown_alertmanager_status_fails_the_title_as_ntfy_does() -> None:
    """alertmanager.yml's `{{ fail "Unsupported Alertmanager status." }}`: 400, 40045, named."""
    error = _error("alertmanager", json.dumps({**AM_FIRING, "status": "pending"}).encode())
    assert (error.http, error.code) == (400, 40045)
    assert error.error == (
        "invalid request: template execution failed; template alertmanager (title): "
        "error calling fail: Unsupported Alertmanager status."
    )


def test_a_grafana_status_it_does_not_know_is_an_unknown_alert() -> None:
    rendered = templates.render(
        "grafana", json.dumps({"status": "pending", "message": "m"}).encode(), 4096
    )
    assert (rendered.title, rendered.message) == ("⚠️ Unknown alert: Alert", "m")


@pytest.mark.parametrize(
    ("name", "body", "code"),
    [
        ("alertmanager", b"web Down [Uptime-Kuma]", 40042),  # not JSON
        ("alertmanager", b'{"status": NaN}', 40042),  # Go's JSON has no NaN
        ("alertmanager", b"[1, 2]", 40045),  # `.status` of a list
        ("alertmanager", b'{"status": 5, "alerts": []}', 40045),  # `title` of a number
        ("alertmanager", b'{"status": "firing", "receiver": "r"}', 40045),  # `first` of nothing
        ("alertmanager", b'{"status": "firing", "alerts": [{"annotations": null}]}', 40045),
        ("grafana", b'{"status": "firing"}', 40045),  # `trunc` of a missing message
        ("grafana", b'{"status": 3, "message": "m"}', 40045),  # `eq` of a number and a string
        ("prometheus", b"{}", 40047),  # ntfy ships no such template
        ("../grafana", b"{}", 40047),  # not a template name
    ],
)
def test_a_body_or_name_ntfy_refuses_is_refused_with_its_code(
    name: str, body: bytes, code: int
) -> None:
    assert _error(name, body).code == code


def test_missing_labels_print_no_value_and_an_empty_group_titles_no_value() -> None:
    """Go prints a missing key as `<no value>` and a JSON null as `<nil>`; `first` of an empty
    list is missing, so its `.labels.alertname` is `<no value>`, not an error."""
    alert = {"labels": {"alertname": "A", "instance": None}, "startsAt": 1234567}
    body = {"status": "firing", "receiver": "r", "alerts": [alert]}
    rendered = templates.render("alertmanager", json.dumps(body).encode(), 4096)
    assert rendered.message == (
        "Status: Firing\nReceiver: r\nAlert: A\nInstance: <nil>\nSeverity: <no value>\n"
        "Starts at: 1.234567e+06\nSource: <no value>"
    )
    empty = templates.render("alertmanager", b'{"status": "resolved", "alerts": []}', 4096)
    assert (empty.title, empty.message) == (
        "✅ Resolved: <no value>",
        "Status: Resolved\nReceiver: <no value>",
    )


def test_grafana_message_is_cut_at_2000_bytes_and_a_split_character_is_replaced() -> None:
    """sprig's `trunc` slices bytes: a cut through "é" leaves one byte, written as U+FFFD."""
    body = {"status": "firing", "title": "t", "message": "x" * 1999 + "é" + "y" * 50}
    rendered = templates.render("grafana", json.dumps(body).encode(), 4096)
    assert rendered.message == "x" * 1999 + "\ufffd"


def test_a_rendered_message_over_the_size_limit_is_40041_and_a_huge_body_413() -> None:
    many = alertmanager_body("firing", [_am_alert(f"Alert{i}", "firing", ZERO) for i in range(40)])
    assert _error("alertmanager", json.dumps(many).encode()).code == 40041
    huge = json.dumps({"status": "firing", "message": "x" * templates.JSON_BODY_LIMIT}).encode()
    error = _error("grafana", huge)
    assert (error.http, error.code) == (413, 41303)


def test_inline_templates_and_githubs_say_the_emulator_does_not_render_them(
    client: httpx.Client,
) -> None:
    """Any boolean value (even `no`) is ntfy's inline mode; the emulator renders only the two
    named templates the daemon's publishers use, and says so rather than pretend."""
    for query in ("tpl=yes", "template=no", "template=github"):
        response = client.post(f"/alerts?{query}&m=x", content=b"{}")
        assert response.status_code == 400
        assert response.json()["code"] == 40043
        assert "not implemented by the ntfy-intake emulator" in response.json()["error"]


@pytest.mark.real_ntfy
@pytest.mark.parametrize(("name", "body", "title", "message"), GOLDEN, ids=IDS)
def test_the_real_server_renders_the_same(
    make_real_ntfy: Callable[..., RealNtfy],
    emu: NtfyEmulator,
    name: str,
    body: dict[str, Any],
    title: str,
    message: str,
) -> None:
    server = make_real_ntfy()
    content = json.dumps(body).encode()
    real = httpx.post(f"{server.url}/alerts?template={name}", content=content, timeout=10)
    emulated = httpx.post(f"{emu.url}/alerts?template={name}", content=content, timeout=10)
    assert real.status_code == emulated.status_code == 200, real.text
    fields = ("title", "message", "tags", "priority")
    assert {k: real.json().get(k) for k in fields} == {k: emulated.json().get(k) for k in fields}
    assert (real.json()["title"], real.json()["message"]) == (title, message)


@pytest.mark.parametrize(
    ("status", "titled"),
    [
        ("firing", "Firing"),
        ("RESOLVED", "Resolved"),
        ("1st ALERT", "1St Alert"),
        ("foo_bar baz", "Foo_bar Baz"),
        ("o'neil-smith x.y", "O'neil-Smith X.y"),
        ("ÉTAT über", "État Über"),
    ],
)
def test_status_is_title_cased_as_x_text_cases_title_does(status: str, titled: str) -> None:
    """`{{ .status | title }}` is golang.org/x/text's cases.Title: Unicode word breaking, the first
    cased letter of each word upper (outputs checked against x/text v0.43.0)."""
    assert templates._title(status) == titled
