"""A scripted client session against an ntfy server, recorded as a normalized transcript.

Every publish kind, every `since` form, polls, a stream, and the errors a subscriber can meet.
Normalization makes two servers comparable: message ids become labels in order of first
appearance, open/keepalive ids become `<frame>`, times become `<time>` and `expires` becomes
`<time+N>`; random action ids become `<action>`. Replays that mix topics within one second are
recorded as sets (the real server's sort is unstable there); everything else keeps its order.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from ..emulator.conftest import RawStream

Step = tuple[str, Any]


class Recorder:
    def __init__(self, url: str) -> None:
        self.url = url
        self.labels: dict[str, str] = {}
        self.steps: list[Step] = []
        self.http = httpx.Client(base_url=url, timeout=10)

    def label(self, message_id: str) -> str:
        return self.labels.setdefault(message_id, f"m{len(self.labels) + 1}")

    def event(self, event: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in event.items():
            if key == "id":
                out[key] = self.label(value) if event.get("event") == "message" else "<frame>"
            elif key == "time":
                out[key] = "<time>"
            elif key == "expires":
                out[key] = f"<time+{value - event['time']}>"
            elif key == "actions":
                out[key] = [{**action, "id": "<action>"} for action in value]
            else:
                out[key] = value
        return out

    def response(self, name: str, response: httpx.Response, *, unordered: bool = False) -> None:
        kind = response.headers.get("content-type", "").split(";")[0]
        body: Any
        if kind in ("application/json", "application/x-ndjson"):
            lines = [json.loads(line) for line in response.text.splitlines() if line]
            body = [self.event(obj) if "event" in obj else obj for obj in lines]
            if unordered:
                body = sorted(body, key=lambda obj: json.dumps(obj, sort_keys=True))
        else:
            body = None  # plain-text pages (404s of the web app) are compared by status only
        self.steps.append((name, {"status": response.status_code, "type": kind, "body": body}))

    def put(self, name: str, topic: str, body: bytes | str = b"", **headers: str) -> str:
        content = body.encode() if isinstance(body, str) else body
        response = self.http.put(
            f"/{topic}",
            content=content,
            headers={k.replace("_", "-"): v for k, v in headers.items()},
        )
        self.response(name, response)
        if response.status_code == 200:
            message_id: str = response.json()["id"]
            return message_id
        return ""

    def poll(self, name: str, path: str, *, unordered: bool = False, **params: str) -> None:
        self.response(
            name, self.http.get(path, params={"poll": "1", **params}), unordered=unordered
        )

    def close(self) -> None:
        self.http.close()


def record_session(url: str) -> list[Step]:
    """Run the script against the server at `url`; return its normalized transcript."""
    rec = Recorder(url)
    try:
        _script(rec)
    finally:
        rec.close()
    return rec.steps


def _script(rec: Recorder) -> None:
    first = rec.put("publish plain", "dt-a", "disk full")
    rec.put("publish titled", "dt-a", "sda1 97%", Title="NAS", Priority="5", Tags="warning,disk")
    on_b = rec.put("publish other topic", "dt-b", "backup stale")
    rec.put("publish uncached", "dt-a", "ephemeral", Cache="no")
    rec.put("publish empty", "dt-a")
    rec.put(
        "publish actions",
        "dt-a",
        "act",
        Actions="view, Open, https://home.example/; http, Reboot, https://api.example/r, method=PUT",
    )
    rec.put("publish attach", "dt-a", "see file", Attach="https://example.com/f.txt")
    rec.put(
        "publish styled",
        "dt-a",
        "**md**",
        Markdown="yes",
        Click="https://c.example",
        Icon="https://c.example/i.png",
    )
    rec.put("publish scheduled", "dt-a", "later", Delay="1h")
    rec.put("publish delay too small", "dt-a", "x", Delay="5s")
    rec.put("publish bad delay", "dt-a", "x", Delay="banana")
    rec.put("publish oversized", "dt-a", "x" * 4096)
    rec.put("publish binary", "dt-a", b"\xff\xfe\x00bin")
    rec.response("publish json", rec.http.post("/", json={"topic": "dt-b", "message": "j"}))
    rec.response("publish json reserved topic", rec.http.post("/", json={"topic": "docs"}))
    rec.response("publish json no topic", rec.http.post("/", json={"message": "j"}))
    rec.response(
        "publish unifiedpush binary", rec.http.put("/dt-b?up=1", content=b"\xff\xfe\x00bin")
    )
    last = rec.put("publish last", "dt-a", "last")

    rec.poll("poll", "/dt-a/json")
    rec.poll("since all", "/dt-a/json", since="all")
    rec.poll("since none", "/dt-a/json", since="none")
    rec.poll("since latest", "/dt-a/json", since="latest")
    rec.poll("since first id", "/dt-a/json", since=first)
    rec.poll("since other topic id", "/dt-a/json", since=on_b)
    rec.poll("since last id", "/dt-a/json", since=last)
    rec.poll("since unknown id", "/dt-b/json", since="AAAAAAAAAAAA")
    rec.poll("since 12 digits", "/dt-b/json", since="123456789012")
    rec.poll("since 1", "/dt-a/json", since="1")
    rec.poll("since duration", "/dt-b/json", since="1h30m")
    rec.poll("since timestamp", "/dt-b/json", since=str(int(time.time()) - 3600))
    rec.poll("since 1d", "/dt-a/json", since="1d")
    rec.poll("since 10 chars", "/dt-a/json", since="abcdefghij")
    rec.poll("scheduled", "/dt-a/json", scheduled="1")
    rec.poll("priority filter", "/dt-a/json", priority="5")
    rec.poll("tags filter", "/dt-a/json", tags="disk")
    rec.poll("bad priority", "/dt-a/json", priority="9")
    rec.poll("two topics", "/dt-a,dt-b/json", unordered=True)
    rec.poll("disallowed topic", "/app/json")
    rec.poll("web app path", "/docs/json")
    rec.response("ws without upgrade", rec.http.get("/dt-a/ws"))
    account = rec.http.get("/v1/account")
    rec.steps.append(("account", (account.status_code, sorted(account.json()))))
    stats = rec.http.get("/v1/stats")
    rec.steps.append(("stats", (stats.status_code, sorted(stats.json()))))

    stream = RawStream(rec.url, f"/dt-a/json?since={first}")
    try:
        opened = rec.event(stream.event(5))
        replay = [rec.event(event) for event in stream.events_until_quiet(1.0)]
        rec.put("publish live", "dt-a", "live")
        live = rec.event(stream.event(5))
    finally:
        stream.close()
    rec.steps.append(("stream", {"open": opened, "replay": replay, "live": live}))
