"""The loopback HTTP surface over real sockets: each test is named after the failure it guards."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ntfy_intake.store import db
from ntfy_intake.store.doorbell import Doorbell, WakeEvent
from ntfy_intake.store.feed import FeedStore
from ntfy_intake.surfaces import http_api, metrics
from ntfy_intake.surfaces import serve as _serve

from ..harness import store_of

pytestmark = pytest.mark.engines

TOKEN = "s3cret-token-for-tests-7Hq2X"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WAIT_BOUND = 10.0  # generous bound for "promptly"; the real figures are milliseconds


@dataclass
class Api:
    url: str
    client: httpx.Client
    db_path: db.Target
    notify_calls: list[tuple[str, str]]
    health: dict[str, Any]
    snapshot: dict[str, Any]
    app: Any = None

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("headers", AUTH)
        return self.client.get(self.url + path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("headers", AUTH)
        return self.client.post(self.url + path, **kwargs)


@dataclass
class Setup:
    tmp_path: Path
    token: str | None = TOKEN
    notify_result: tuple[int, Mapping[str, Any]] | Exception | None = None
    health: dict[str, Any] = field(default_factory=lambda: {"ok": True, "details": {}})


def post_entry(db_path: db.Target, summary: str = "alerts: 'Disk' sev 4", **payload: object) -> int:
    with FeedStore.open(db_path) as store:
        body = payload or {"events": [{"message": "disk full"}]}
        return store.post("triage", body, sender="ntfy-intake", summary=summary).seq


@pytest.fixture
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Setup:
    """Indirect parametrization sets the configured token (None: feed and notify off)."""
    return Setup(tmp_path, token=getattr(request, "param", TOKEN))


@pytest.fixture
def api(setup: Setup) -> Iterator[Api]:
    db_path = store_of(setup.tmp_path)
    calls: list[tuple[str, str]] = []
    snapshot: dict[str, Any] = {
        "intake_state": "live",
        "last_frame_age_s": 0.5,
        "connections_total": 1,
        "feed_head": {"triage": 0},
    }

    async def notify(text: str, key: str) -> tuple[int, Mapping[str, Any]]:
        calls.append((text, key))
        result = setup.notify_result
        if isinstance(result, Exception):
            raise result
        return result or (202, {"key": key, "result": "queued"})

    def health() -> tuple[bool, Mapping[str, Any]]:
        return bool(setup.health["ok"]), setup.health["details"]

    app = http_api.create_app(
        db_path=db_path,
        token=setup.token,
        notify=notify,
        health=health,
        metrics_snapshot=lambda: snapshot,
    )
    with (
        _serve.serving(app, on_stop=lambda: http_api.begin_shutdown(app)) as url,
        httpx.Client(timeout=30.0) as client,
    ):
        yield Api(url, client, db_path, calls, setup.health, snapshot, app)


# -- auth -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/feed/triager", None),
        ("POST", "/v1/feed/triager/ack", {"channel": "triage", "seq": 0}),
        ("GET", "/v1/feed/triager/wait?timeout=0", None),
        ("POST", "/v1/notify", {"text": "hi"}),
    ],
)
@pytest.mark.one_engine("the bearer check answers before any route reads the store")
def test_missing_token_is_401_and_wrong_token_is_403(
    api: Api, method: str, path: str, body: object
) -> None:
    def call(headers: dict[str, str]) -> httpx.Response:
        return api.client.request(method, api.url + path, headers=headers, json=body)

    missing = call({})
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert call({"Authorization": f"Basic {TOKEN}"}).status_code == 401
    assert call({"Authorization": "Bearer"}).status_code == 401
    wrong = call({"Authorization": f"Bearer {TOKEN}x", "Idempotency-Key": "k1"})
    assert wrong.status_code == 403
    for response in (missing, wrong):
        assert TOKEN not in response.text
        assert response.json()["error"] in {"unauthorized", "forbidden"}
    assert api.notify_calls == []


@pytest.mark.one_engine("the bearer check; the feed read is test_http_api's feed tests'")
def test_bearer_scheme_is_case_insensitive(api: Api) -> None:
    response = api.get("/v1/feed/triager", headers={"Authorization": f"bearer {TOKEN}"})
    assert response.status_code == 200


@pytest.mark.parametrize("setup", [None], indirect=True)
@pytest.mark.one_engine("routing without a token; no store read")
def test_feed_and_notify_are_off_with_404_when_no_token_is_configured(api: Api) -> None:
    for headers in ({}, AUTH):
        assert api.get("/v1/feed/triager", headers=headers).status_code == 404
        assert api.get("/v1/feed/triager/wait?timeout=0", headers=headers).status_code == 404
        ack = api.post(
            "/v1/feed/triager/ack", headers=headers, json={"channel": "triage", "seq": 0}
        )
        assert ack.status_code == 404
        notify = api.post(
            "/v1/notify", headers={**headers, "Idempotency-Key": "k"}, json={"text": "x"}
        )
        assert notify.status_code == 404
    assert api.notify_calls == []
    assert api.get("/healthz", headers={}).status_code == 200
    assert api.get("/metrics", headers={}).status_code == 200


@pytest.mark.one_engine("the HTTP surface's auth; no store read")
def test_healthz_and_metrics_need_no_token(api: Api) -> None:
    assert api.get("/healthz", headers={}).status_code == 200
    assert api.get("/metrics", headers={}).status_code == 200


@pytest.mark.one_engine("routing; no store read")
def test_unknown_paths_and_methods_answer_json_not_html(api: Api) -> None:
    missing = api.get("/nope", headers={})
    assert missing.status_code == 404
    assert missing.json() == {"error": "not_found"}
    wrong_method = api.client.delete(api.url + "/healthz")
    assert wrong_method.status_code == 405
    assert wrong_method.json() == {"error": "method_not_allowed"}


# -- feed -----------------------------------------------------------------------------------------


def test_first_feed_call_joins_at_head_and_at_start_gives_history(api: Api) -> None:
    first, second = post_entry(api.db_path, "one"), post_entry(api.db_path, "two")
    assert (first, second) == (1, 2)

    newcomer = api.get("/v1/feed/newcomer")
    assert newcomer.status_code == 200
    assert newcomer.json() == []  # joined at head: no flood of history
    third = post_entry(api.db_path, "three")
    assert [e["seq"] for e in api.get("/v1/feed/newcomer").json()] == [third]

    history = api.get("/v1/feed/historian?at=start").json()
    assert [e["seq"] for e in history] == [1, 2, 3]
    entry = history[0]
    assert entry["channel"] == "triage"
    assert entry["delivery_key"]
    assert entry["payload"] == {"events": [{"message": "disk full"}]}
    # at=start on a later call never resets an existing cursor
    assert [e["seq"] for e in api.get("/v1/feed/newcomer?at=start").json()] == [third]


def test_reading_the_feed_never_consumes(api: Api) -> None:
    api.get("/v1/feed/triager")
    post_entry(api.db_path)
    assert len(api.get("/v1/feed/triager").json()) == 1
    assert len(api.get("/v1/feed/triager").json()) == 1


def test_feed_pages_with_after_and_limit_until_an_empty_page(api: Api) -> None:
    for n in range(5):
        post_entry(api.db_path, f"e{n}")
    seen: list[int] = []
    after = 0
    while page := api.get(f"/v1/feed/pager?at=start&after={after}&limit=2").json():
        assert len(page) <= 2
        seen.extend(e["seq"] for e in page)
        after = page[-1]["seq"]
    assert seen == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "query",
    ["?limit=0", "?limit=1001", "?after=-1", "?after=x", "?at=middle", "?channel=bad%20name"],
)
@pytest.mark.one_engine("query validation before the store")
def test_bad_feed_query_parameters_are_400(api: Api, query: str) -> None:
    response = api.get(f"/v1/feed/triager{query}")
    assert response.status_code == 400
    assert "error" in response.json()


@pytest.mark.one_engine("path validation before the store")
def test_bad_handle_is_400(api: Api) -> None:
    assert api.get("/v1/feed/-leading-dash").status_code == 400


def test_ack_moves_the_cursor_and_a_stale_ack_returns_it_unchanged(api: Api) -> None:
    api.get("/v1/feed/triager")
    for _ in range(3):
        post_entry(api.db_path)
    moved = api.post("/v1/feed/triager/ack", json={"channel": "triage", "seq": 2})
    assert moved.status_code == 200
    assert moved.json() == {"channel": "triage", "cursor": 2}
    stale = api.post("/v1/feed/triager/ack", json={"channel": "triage", "seq": 1})
    assert stale.status_code == 200
    assert stale.json() == {"channel": "triage", "cursor": 2}
    assert [e["seq"] for e in api.get("/v1/feed/triager").json()] == [3]


def test_ack_beyond_head_is_409_and_moves_nothing(api: Api) -> None:
    api.get("/v1/feed/triager")
    post_entry(api.db_path)
    response = api.post("/v1/feed/triager/ack", json={"channel": "triage", "seq": 2})
    assert response.status_code == 409
    assert response.json()["error"] == "beyond_head"
    with FeedStore.open(api.db_path) as store:
        assert store.cursor("triager", "triage") == 0


def test_ack_on_a_channel_never_joined_is_409(api: Api) -> None:
    response = api.post("/v1/feed/stranger/ack", json={"channel": "triage", "seq": 0})
    assert response.status_code == 409
    assert response.json()["error"] == "not_joined"


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2]",
        b'{"channel": "triage"}',
        b'{"channel": "triage", "seq": -1}',
        b'{"channel": "triage", "seq": true}',
        b'{"channel": "triage", "seq": 1.5}',
        b'{"channel": 7, "seq": 1}',
        b'{"channel": "bad name", "seq": 1}',
        b'{"channel": "triage", "seq": NaN}',
    ],
)
@pytest.mark.one_engine("body validation before the store")
def test_ack_with_bad_json_or_fields_is_400(api: Api, content: bytes) -> None:
    api.get("/v1/feed/triager")
    response = api.post("/v1/feed/triager/ack", content=content)
    assert response.status_code == 400


def test_wait_rings_at_once_over_unacked_backlog(api: Api) -> None:
    api.get("/v1/feed/triager")
    post_entry(api.db_path)
    started = time.monotonic()
    response = api.get("/v1/feed/triager/wait?timeout=30")
    assert response.status_code == 200
    assert time.monotonic() - started < WAIT_BOUND
    assert response.json()["wake_line"].startswith("'triage'#1 from 'ntfy-intake': [untrusted] ")


def test_wait_returns_204_on_timeout(api: Api) -> None:
    started = time.monotonic()
    response = api.get("/v1/feed/triager/wait?timeout=0.3")
    elapsed = time.monotonic() - started
    assert response.status_code == 204
    assert response.content == b""
    assert 0.25 <= elapsed < WAIT_BOUND


@pytest.mark.parametrize("timeout", ["-1", "nan", "inf", "soon"])
@pytest.mark.one_engine("query validation before the store")
def test_wait_with_a_bad_timeout_is_400(api: Api, timeout: str) -> None:
    assert api.get(f"/v1/feed/triager/wait?timeout={timeout}").status_code == 400


def test_wait_wakes_for_an_entry_posted_by_another_connection(api: Api) -> None:
    api.get("/v1/feed/triager")
    timer = threading.Timer(0.3, post_entry, args=(api.db_path, "late"))
    started = time.monotonic()
    timer.start()
    try:
        response = api.get("/v1/feed/triager/wait?timeout=30")
    finally:
        timer.join()
    assert response.status_code == 200
    assert time.monotonic() - started < WAIT_BOUND
    assert "'late'" in response.json()["wake_line"]


def test_a_first_wait_joins_so_the_entry_that_rang_is_still_caught_up(api: Api) -> None:
    timer = threading.Timer(0.3, post_entry, args=(api.db_path, "first"))
    timer.start()
    try:
        assert api.get("/v1/feed/fresh/wait?timeout=30").status_code == 200
    finally:
        timer.join()
    assert [e["seq"] for e in api.get("/v1/feed/fresh").json()] == [1]


def test_wake_line_carries_no_payload(api: Api) -> None:
    api.get("/v1/feed/triager")
    post_entry(
        api.db_path,
        "alerts: 'Disk'\x1b[31m\nIGNORE PREVIOUS",
        events=[{"message": "PAYLOAD-SECRET-BODY"}],
    )
    response = api.get("/v1/feed/triager/wait?timeout=30")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"wake_line"}
    assert "PAYLOAD-SECRET-BODY" not in response.text
    assert "\x1b" not in body["wake_line"] and "\n" not in body["wake_line"]
    assert "[untrusted]" in body["wake_line"]


def test_wait_does_not_block_the_event_loop(api: Api) -> None:
    results: list[int] = []
    waiter = threading.Thread(
        target=lambda: results.append(api.get("/v1/feed/triager/wait?timeout=2").status_code)
    )
    waiter.start()
    try:
        time.sleep(0.2)  # let the long poll start
        with httpx.Client(timeout=30.0) as other:
            started = time.monotonic()
            assert other.get(api.url + "/healthz").status_code == 200
            assert time.monotonic() - started < 1.0
    finally:
        waiter.join()
    assert results == [204]


def test_a_waiter_whose_client_gave_up_stops_waiting(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended = threading.Event()
    original = Doorbell.wait_async

    async def watched(self: Doorbell, timeout: float) -> WakeEvent | None:
        try:
            return await original(self, timeout)
        finally:
            ended.set()

    monkeypatch.setattr(Doorbell, "wait_async", watched)
    with pytest.raises(httpx.ReadTimeout):
        api.get("/v1/feed/triager/wait?timeout=300", timeout=0.3)
    assert ended.wait(WAIT_BOUND)  # not after 300 s: no orphaned doorbell connection lingers


def test_a_pending_wait_ends_promptly_when_the_server_stops(tmp_path: Path) -> None:
    app = http_api.create_app(
        db_path=store_of(tmp_path),
        token=TOKEN,
        notify=None,
        health=lambda: (True, {}),
        metrics_snapshot=dict,
    )
    results: list[int] = []
    with _serve.serving(app, on_stop=lambda: http_api.begin_shutdown(app)) as url:

        def wait() -> None:
            with httpx.Client(timeout=30.0) as client:
                results.append(
                    client.get(url + "/v1/feed/triager/wait?timeout=300", headers=AUTH).status_code
                )

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)
        started = time.monotonic()
    waiter.join(WAIT_BOUND)
    assert not waiter.is_alive()
    assert time.monotonic() - started < WAIT_BOUND
    assert results == [503]


# -- notify ---------------------------------------------------------------------------------------


@pytest.mark.one_engine("notify's validation; the callback is a stub of the test's")
def test_notify_requires_an_idempotency_key(api: Api) -> None:
    response = api.post("/v1/notify", json={"text": "disk replaced"})
    assert response.status_code == 400
    assert response.json()["error"] == "missing_idempotency_key"
    spaced = api.post(
        "/v1/notify", headers={**AUTH, "Idempotency-Key": "has space"}, json={"text": "x"}
    )
    assert spaced.status_code == 400
    assert api.notify_calls == []


@pytest.mark.one_engine("notify's HTTP answer; the callback is the test's")
def test_notify_passes_the_callback_result_through(api: Api, setup: Setup) -> None:
    headers = {**AUTH, "Idempotency-Key": "agent-42"}
    response = api.post("/v1/notify", headers=headers, json={"text": "disk replaced"})
    assert response.status_code == 202
    assert response.json() == {"key": "agent-42", "result": "queued"}
    assert api.notify_calls == [("disk replaced", "agent-42")]
    setup.notify_result = (200, {"key": "agent-42", "result": "duplicate"})
    again = api.post("/v1/notify", headers=headers, json={"text": "disk replaced"})
    assert (again.status_code, again.json()["result"]) == (200, "duplicate")


@pytest.mark.parametrize(
    "body", [{"text": ""}, {"text": "   "}, {"text": 5}, {}, {"text": "x" * 4001}, ["text"]]
)
@pytest.mark.one_engine("notify's validation; no store")
def test_notify_rejects_missing_empty_or_too_long_text(api: Api, body: object) -> None:
    headers = {**AUTH, "Idempotency-Key": "k1"}
    assert api.post("/v1/notify", headers=headers, json=body).status_code == 400
    assert api.notify_calls == []


@pytest.mark.one_engine("notify's validation; no store")
def test_notify_accepts_text_at_the_limit(api: Api) -> None:
    headers = {**AUTH, "Idempotency-Key": "k1"}
    assert api.post("/v1/notify", headers=headers, json={"text": "x" * 4000}).status_code == 202


@pytest.mark.one_engine("the body-size bound on the wire; no store")
def test_notify_body_too_large_is_413(api: Api) -> None:
    headers = {**AUTH, "Idempotency-Key": "k1"}
    big = json.dumps({"text": "x", "pad": "y" * (http_api.MAX_NOTIFY_BODY + 1)})
    assert api.post("/v1/notify", headers=headers, content=big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed size is checked too
        yield b'{"text": "x", "pad": "'
        for _ in range(20):
            yield b"y" * 8192
        yield b'"}'

    assert api.post("/v1/notify", headers=headers, content=chunks()).status_code == 413
    assert api.notify_calls == []


@pytest.mark.one_engine("the HTTP surface's error answer; no store")
def test_a_handler_error_is_a_bare_500_without_details(api: Api, setup: Setup) -> None:
    setup.notify_result = RuntimeError("Traceback SECRET alert text")
    headers = {**AUTH, "Idempotency-Key": "k1"}
    response = api.post("/v1/notify", headers=headers, json={"text": "hello"})
    assert response.status_code == 500
    assert response.json() == {"error": "internal"}
    assert "SECRET" not in response.text


# -- health and metrics ---------------------------------------------------------------------------


@pytest.mark.one_engine("healthz from the test's callback; no store")
def test_healthz_is_200_when_healthy_and_503_with_the_reason_when_not(api: Api) -> None:
    ok = api.get("/healthz", headers={})
    assert (ok.status_code, ok.json()) == (200, {"status": "live"})
    api.health.update(ok=False, details={"reason": "intake is dead (last frame 300 s ago)"})
    bad = api.get("/healthz", headers={})
    assert bad.status_code == 503
    assert bad.json() == {"status": "unhealthy", "reason": "intake is dead (last frame 300 s ago)"}


@pytest.mark.one_engine("healthz from the test's callback; no store")
def test_healthz_callback_failure_is_503_not_500(api: Api) -> None:
    api.health["details"] = None  # dict(None) raises inside the handler
    response = api.get("/healthz", headers={})
    assert response.status_code == 503
    assert response.json()["status"] == "unhealthy"


@pytest.mark.one_engine("the exposition of the test's snapshot; no store")
def test_metrics_exposition_parses_and_contains_the_documented_names(api: Api) -> None:
    api.snapshot.update(
        {
            "reconnects_total": 2,
            "watchdog_drops_total": 0,
            "events_recorded_total": 9,
            "duplicates_total": 1,
            "conflicts_total": 0,
            "quarantined_total": 0,
            "cursor_moves_total": 9,
            "audit_latch": False,
            "health_state": "live",
            "relay_collecting": 0,
            "relay_pending": 0,
            "relay_dead": 0,
            "relay_delivered_total": 4,
            "relay_attempts_total": 5,
            "owner_pending": 0,
            "owner_sent_total": 1,
            "owner_suppressed_total": 0,
            "owner_receive_last_ok_age_s": 4.5,
            "owner_receive_failures_total": 2,
            "escalations_today": 1,
            "escalations_held_today": 0,
            "feed_head": {"triage": 3},
            "leader": 1,
            "term": 1,
            "failovers_total": 0,
            "ready": True,
            "cluster_intake_live": True,
        }
    )
    response = api.get("/metrics", headers={})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    assert set(metrics.METRIC_NAMES) <= set(samples)
    assert samples["ntfy_intake_events_recorded_total"] == 9
    assert samples["ntfy_intake_feed_head"] == 3
    assert samples["ntfy_intake_owner_receive_last_ok_age_seconds"] == 4.5
    assert samples["ntfy_intake_owner_receive_failures_total"] == 2
    api.snapshot["events_recorded_total"] = 10  # read at scrape time
    assert "ntfy_intake_events_recorded_total 10.0" in api.get("/metrics", headers={}).text


# -- serve(): uvicorn in the caller's loop --------------------------------------------------------


def test_serve_runs_in_the_callers_loop_reports_its_port_and_stops_long_polls(
    tmp_path: Path,
) -> None:
    app = http_api.create_app(
        db_path=store_of(tmp_path),
        token=TOKEN,
        notify=None,
        health=lambda: (True, {}),
        metrics_snapshot=dict,
    )
    sigterm_before = signal.getsignal(signal.SIGTERM)

    async def scenario() -> tuple[int, int, float, Any]:
        stop = asyncio.Event()
        bound: list[int] = []
        server = asyncio.create_task(http_api.serve(app, "127.0.0.1", 0, stop, bound.append))
        while not bound:
            assert not server.done(), server
            await asyncio.sleep(0.01)
        handler_while_serving = signal.getsignal(signal.SIGTERM)
        base = _serve.base_url("127.0.0.1", bound[0])
        async with httpx.AsyncClient(timeout=30.0) as client:
            health = await client.get(base + "/healthz")
            waiter = asyncio.create_task(
                client.get(base + "/v1/feed/triager/wait?timeout=300", headers=AUTH)
            )
            await asyncio.sleep(0.3)
            started = time.monotonic()
            stop.set()
            pending = await asyncio.wait_for(waiter, WAIT_BOUND)
            await asyncio.wait_for(server, WAIT_BOUND)
            elapsed = time.monotonic() - started
        assert bound[0] > 0
        return health.status_code, pending.status_code, elapsed, handler_while_serving

    health, pending, elapsed, handler_while_serving = asyncio.run(scenario())
    assert health == 200
    assert pending == 503
    assert elapsed < WAIT_BOUND
    assert handler_while_serving is sigterm_before  # uvicorn installed no signal handler
    assert signal.getsignal(signal.SIGTERM) is sigterm_before


@pytest.mark.one_engine("a bind failure; nothing reads the store")
def test_serve_bind_failure_raises_before_anything_starts(tmp_path: Path) -> None:
    app = http_api.create_app(
        db_path=store_of(tmp_path),
        token=None,
        notify=None,
        health=lambda: (True, {}),
        metrics_snapshot=dict,
    )
    with _serve.serving(app) as url:
        port = int(url.rsplit(":", 1)[1])

        async def clash() -> None:
            await http_api.serve(app, "127.0.0.1", port, asyncio.Event())

        with pytest.raises(OSError):
            asyncio.run(clash())
