"""Connection failures name the URL, the cause, ntfy's error text and the setting to check."""

from __future__ import annotations

import httpx
import pytest

from ntfy_intake.wire import diagnose

URL = "https://ntfy.example.lan/alerts,backups/json"
TOPICS = ("alerts", "backups")


def test_404_names_the_url_ntfys_error_and_the_ntfy_url_setting() -> None:
    line = diagnose.http_failure(
        "https://ntfy.example.lan/v1/alerts,backups/json",
        TOPICS,
        404,
        '{"code":40401,"http":404,"error":"page not found"}\n',
    )
    assert line.startswith("HTTP 404 from https://ntfy.example.lan/v1/alerts,backups/json")
    assert "(ntfy says: 40401 page not found)" in line
    assert "check ntfy.url (it has the path prefix '/v1')" in line


def test_401_points_at_the_token() -> None:
    body = '{"code":40101,"http":401,"error":"unauthorized","link":"https://ntfy.sh/docs/publish/#authentication"}'
    line = diagnose.http_failure(URL, TOPICS, 401, body)
    assert "40101 unauthorized" in line and "check ntfy.token" in line


def test_403_names_the_topics() -> None:
    line = diagnose.http_failure(URL, TOPICS, 403, '{"code":40301,"http":403,"error":"forbidden"}')
    assert "40301 forbidden" in line
    assert "may not read topic(s) alerts, backups" in line


def test_400_40009_names_the_topics_as_refused() -> None:
    body = '{"code":40009,"http":400,"error":"invalid request: topic invalid"}'
    assert "refuses topic(s) alerts, backups" in diagnose.http_failure(URL, TOPICS, 400, body)


def test_a_non_json_body_is_quoted_sanitized_and_short() -> None:
    line = diagnose.http_failure(URL, TOPICS, 502, "<html>\x1b[31mBad gateway" + "x" * 500)
    assert "\x1b" not in line and "\n" not in line
    assert "ntfy says: <html>" in line
    assert len(line) < 500
    assert "unavailable: retrying with backoff" in line


def test_credentials_in_the_url_never_reach_the_line() -> None:
    url = "https://me:tk_secret@ntfy.example.lan:8443/alerts/json"
    line = diagnose.http_failure(url, ("alerts",), 500, None)
    assert "tk_secret" not in line and "me:" not in line
    assert "https://ntfy.example.lan:8443/alerts/json" in line
    assert "tk_secret" not in diagnose.subscription(url, ("alerts",), token=True, since="all")


@pytest.mark.parametrize(
    ("exc", "needle"),
    [
        (
            httpx.ConnectError("[Errno 111] Connection refused"),
            "connection refused by ntfy.example.lan:443",
        ),
        (
            httpx.ConnectError("[Errno -2] Name or service not known"),
            "cannot resolve ntfy.example.lan",
        ),
        (
            httpx.ConnectError("[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:992)"),
            "check http:// vs https://",
        ),
        (httpx.ConnectTimeout(""), "ConnectTimeout talking to https://ntfy.example.lan"),
        (httpx.ReadError("boom"), "ReadError talking to"),
    ],
)
def test_transport_failures_name_the_cause_and_the_url(exc: Exception, needle: str) -> None:
    line = diagnose.transport_failure(URL, exc)
    assert needle in line
    assert "ntfy.example.lan" in line and "\n" not in line


def test_start_up_line_names_server_topics_and_token_presence() -> None:
    assert diagnose.subscription(
        "https://ntfy.example.lan/", TOPICS, token=True, since="id:abc"
    ) == (
        "subscribing to https://ntfy.example.lan/alerts,backups/json for 2 topic(s) "
        "alerts, backups (token: yes) since id:abc"
    )
