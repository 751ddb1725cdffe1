"""Small HTTP details where the emulator once differed from a real ntfy v2.13 (found by running
the same requests against both, docs/emulator.md "Fidelity")."""

from __future__ import annotations

import httpx


def test_options_answers_without_a_content_type(client: httpx.Client) -> None:
    response = client.options("/t")
    assert response.status_code == 200
    assert "content-type" not in response.headers
    assert response.headers["access-control-allow-origin"] == "*"


def test_binary_body_is_40014_unless_unifiedpush_which_base64_encodes_it(
    client: httpx.Client,
) -> None:
    assert client.put("/t", content=b"\xff\xfe\x00x").json()["code"] == 40014
    event = client.put("/t", content=b"\xff\xfe\x00x", headers={"X-UnifiedPush": "1"}).json()
    assert (event["message"], event["encoding"]) == ("//4AeA==", "base64")


def test_disallowed_topics_are_40009_on_every_subscribe_endpoint(client: httpx.Client) -> None:
    for path in ("/v1/json", "/app/sse", "/docs,t/raw"):
        response = client.get(path, params={"poll": "1"})
        assert response.json() == {
            "code": 40009,
            "http": 400,
            "error": "invalid request: topic invalid",
        }
    # Without auth, /<topics>/auth checks nothing, not even the names (as the real server).
    assert client.get("/account/auth").json() == {"success": True}
