"""No input yields a 500: generated paths, methods, headers and bodies against every endpoint of the
daemon's HTTP surface, of the owner console (every page and form, against the real daemon, with
and without a session and CSRF token) and of the reference receiver. Each answer below 500 carries a JSON body
(or none, for 204), so a client always learns what was wrong."""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ntfy_intake.store import db
from ntfy_intake.store.feed import FeedStore
from ntfy_intake.surfaces import http_api
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.surfaces.console.sessions import COOKIE as CONSOLE_COOKIE
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire import signing

from ..harness import DaemonThread, separate_store, settings_for, wait_until

TOKEN = "tok-for-property-tests-7Hq2X"
SECRET = signing.parse_secret(signing.new_secret(bytes(range(40, 72))))

# JSON values with the shapes that broke things before: lone surrogates, deep nesting, huge
# numbers, NUL and ANSI, wrong types where a string or an int is expected.
_text = st.lists(
    st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(["\ud83d", "\udfff", "\x00", "\x1b[31m", "\u202e"]),
    ),
    max_size=40,
).map("".join)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=12,
)
_shaped = st.fixed_dictionaries(
    {},
    optional={
        "text": st.one_of(_text, _json),
        "channel": st.one_of(st.just("triage"), _text, _json),
        "seq": st.one_of(st.integers(min_value=-5, max_value=2**64), _json),
        "schema": st.one_of(st.just(receiver.SCHEMA), _text),
        "delivery_key": st.one_of(st.just("tri_prop"), _text),
        "incident": _json,
        "events": _json,
    },
)
# Deeper than the decoder's recursion limit yet under the 4 KiB ack cap, or far deeper.
_deep = st.one_of(st.integers(900, 2040), st.integers(2041, 50_000)).map(
    lambda n: b"[" * n + b"]" * n
)
_bodies = st.one_of(
    _json.map(lambda v: json.dumps(v).encode()),
    _shaped.map(lambda v: json.dumps(v).encode()),
    _shaped.map(lambda v: json.dumps(v).encode()),
    _deep,
    st.sampled_from([b"1e400", b"[NaN]", b'{"text": Infinity}', b"1" * 5000, b"\xff\xfe"]),
    st.binary(max_size=200),
)
_header_value = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60).map(
        lambda t: t.strip() or "x"
    ),
    # Raw bytes as a client may send them (obs-text above 0x7f included); the client library
    # itself refuses control bytes, so those never reach a server through it.
    st.lists(st.integers(0x21, 0xFF).filter(lambda b: b != 0x7F), max_size=60).map(bytes),
)
_segment = st.one_of(
    st.sampled_from(["triager", "a" * 300, "%ED%A0%BD", "..", "%00", "x%2Fy"]),
    st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/?#%"),
        min_size=1,
        max_size=30,
    ),
)
_query = st.dictionaries(
    st.sampled_from(["channel", "after", "limit", "at", "timeout", "x"]),
    st.one_of(
        st.sampled_from(["0", "-1", "1e309", "nan", "inf", "99999999999999999999", "start", ""]),
        _text.filter(lambda t: not t.strip().replace(".", "", 1).isdigit()),
    ),
    max_size=3,
)


@st.composite
def daemon_requests(draw: st.DrawFn) -> tuple[str, str, dict[str, Any], bytes]:
    handle = draw(_segment)
    path, method = draw(
        st.sampled_from(
            [
                (f"/v1/feed/{handle}", "GET"),
                (f"/v1/feed/{handle}/ack", "POST"),
                (f"/v1/feed/{handle}/wait", "GET"),
                ("/v1/notify", "POST"),
                ("/v1/notify", "POST"),
                ("/healthz", "GET"),
                ("/metrics", "GET"),
                (f"/{handle}", "GET"),
                (f"/v1/feed/{handle}/{handle}", "POST"),
            ]
        )
    )
    if draw(st.integers(0, 4)) == 0:  # mostly the right method, sometimes any
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]))
    query = draw(_query)
    if path.endswith("/wait"):
        query["timeout"] = draw(st.sampled_from(["0", "nan", "-1", "x", "1e309"]))
    headers: dict[str, Any] = {}
    # Mostly authorized with a usable key, so generated bodies reach the handlers.
    if draw(st.integers(0, 3)):
        headers["Authorization"] = draw(st.sampled_from([f"Bearer {TOKEN}"] * 3) | _header_value)
    if draw(st.integers(0, 3)):
        headers["Idempotency-Key"] = draw(st.just("key-1") | _header_value)
    # Bodies shaped for the endpoint half the time, so generated values reach its field checks.
    shaped = {
        "/v1/notify": st.fixed_dictionaries({"text": _text | _json}),
        "/ack": st.fixed_dictionaries(
            {"channel": st.just("triage") | _text, "seq": st.integers(-5, 2**64) | _json}
        ),
    }
    fitting = next((v for k, v in shaped.items() if path.endswith(k)), None)
    if fitting is not None and draw(st.booleans()):
        body = json.dumps(draw(fitting)).encode()
    else:
        body = draw(_bodies)
    return method, path + _encode(query), headers, body


def _encode(query: Mapping[str, str]) -> str:
    from urllib.parse import urlencode  # noqa: PLC0415

    text = urlencode(query, errors="surrogatepass")
    return f"?{text}" if text else ""


def _assert_answer(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        assert isinstance(response.json(), dict) and "error" in response.json()


@pytest.fixture(scope="module")
def shared() -> Iterator[dict[object, Any]]:
    """What the module's tests share per engine (the daemon's HTTP surface, the console's
    daemon), built by the first test on that engine and kept until the module ends, each in a
    store of its own: on PostgreSQL a schema that outlives the test's (harness.separate_store)."""
    with contextlib.ExitStack() as stack:
        yield {"stack": stack}


def _shared(shared: dict[object, Any], engine: str, make: Callable[[], Any]) -> Any:
    key = (engine, make.__name__)
    if key not in shared:
        shared[key] = shared["stack"].enter_context(make())
    return shared[key]


def _count(target: db.Target, sql: str) -> int:
    if not db.exists(target):
        return -1
    conn = db.connect(target, readonly=True)
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


@contextlib.contextmanager
def _daemon_surface() -> Iterator[httpx.Client]:
    with tempfile.TemporaryDirectory() as tmp, separate_store(Path(tmp)) as target:
        with FeedStore.open(target) as store:
            store.post("triage", {"events": []}, sender="ntfy-intake", summary="x")

        async def notify(text: str, key: str) -> tuple[int, Mapping[str, Any]]:
            # The daemon stores the text as UTF-8: an invalid string here would be its 500.
            text.encode("utf-8")
            key.encode("ascii")
            return 202, {"key": key}

        app = http_api.create_app(
            db_path=target,
            token=TOKEN,
            notify=notify,
            health=lambda: (True, {}),
            metrics_snapshot=lambda: {"intake_state": "live", "feed_head": {"triage": 1}},
        )
        with (
            _serve.serving(app, on_stop=lambda: http_api.begin_shutdown(app)) as url,
            httpx.Client(base_url=url, timeout=30.0) as client,
        ):
            yield client


@pytest.fixture
def daemon_client(shared: dict[object, Any], engine: str) -> httpx.Client:
    client: httpx.Client = _shared(shared, engine, _daemon_surface)
    return client


@pytest.mark.engines  # the feed's store, the daemon's
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(daemon_requests())
def test_no_input_to_the_daemon_http_surface_yields_a_500(
    daemon_client: httpx.Client, request_parts: tuple[str, str, dict[str, Any], bytes]
) -> None:
    method, path, headers, body = request_parts
    response = daemon_client.request(method, path, headers=headers, content=body)
    _assert_answer(response)


@pytest.mark.engines  # the feed's store, the daemon's
@pytest.mark.parametrize(
    "body",
    [
        b'{"text": "Disk full \\ud83d"}',
        b'{"text": "x", "pad": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    ],
)
def test_lone_surrogate_or_deep_json_in_notify_is_400_not_500(
    daemon_client: httpx.Client, body: bytes
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": "k1"}
    response = daemon_client.post("/v1/notify", headers=headers, content=body)
    assert (response.status_code, response.json()["error"]) == (400, "bad_json")


@pytest.mark.engines  # the feed's store, the daemon's
def test_deep_json_in_an_ack_body_is_400_not_500(daemon_client: httpx.Client) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = (
        b'{"channel": "triage", "seq": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    )  # within the 4 KiB cap
    response = daemon_client.post("/v1/feed/triager/ack", headers=headers, content=body)
    assert (response.status_code, response.json()["error"]) == (400, "bad_json")


@st.composite
def receiver_requests(draw: st.DrawFn) -> tuple[str, str, dict[str, Any], bytes]:
    body = draw(_bodies)
    key = draw(st.one_of(st.just("tri_prop"), _header_value))
    headers: dict[str, Any] = {"Idempotency-Key": key} if draw(st.booleans()) else {}
    if draw(st.booleans()) and isinstance(key, str) and key.isascii():
        headers |= signing.sign(SECRET, key, body if body.isascii() else b"", 1_000.0)
    for name in ("webhook-id", "webhook-timestamp", "webhook-signature", "Authorization"):
        if draw(st.integers(0, 4)) == 0:
            headers[name] = draw(_header_value)
    path = draw(st.sampled_from(["/triage", "/", "/healthz", "/nope"]))
    method = draw(st.sampled_from(["GET", "POST", "PUT"]))
    return method, path, headers, body


@pytest.fixture(scope="module", params=["signed", "unsigned"])
def receiver_client(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    with tempfile.TemporaryDirectory() as tmp:
        secret = SECRET if request.param == "signed" else None
        app = receiver.create_app(Path(tmp) / "r.sqlite3", secret=secret, clock=lambda: 1_000.0)
        with (
            _serve.serving(app, on_stop=app.state.stopping.set) as url,
            httpx.Client(base_url=url, timeout=30.0) as client,
        ):
            yield client


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(receiver_requests())
def test_no_input_to_the_reference_receiver_yields_a_500(
    receiver_client: httpx.Client, request_parts: tuple[str, str, dict[str, Any], bytes]
) -> None:
    method, path, headers, body = request_parts
    response = receiver_client.request(method, path, headers=headers, content=body)
    assert response.status_code < 500, (response.status_code, response.text)


# -- the owner console: every page and form, with and without a session and its CSRF token -------

CONSOLE_TOKEN = "console-property-token-7Hq2X"
CONSOLE_GET = [
    "/console/",
    "/console",
    "/console/login",
    "/console/logout",
    "/console/incidents",
    "/console/deliveries",
    "/console/owner",
    "/console/quarantine",
    "/console/audit",
    "/console/static/console.js",
    "/console/static/console.css",
    "/console/static/..%2F..%2Fapp.py",
    "/console/static/nope.js",
    "/v1/silences",
]
CONSOLE_POST = [
    "/console/login",
    "/console/logout",
    "/console/redrive",
    "/console/silences",
    "/console/silences/end",
    "/v1/silences",
    "/v1/silences/sil_0abc/end",
    "/v1/silences/..%2Fx/end",
]
_form_value = st.one_of(
    st.sampled_from(
        [
            "",
            "topic",
            "incident",
            "alerts",
            "2h",
            "0s",
            "25h",
            "99999999999999999999m",
            "1",
            "sil_0abc",
            "/console/",
            "//evil.example/",
            "https://evil.example/",
            "javascript:alert(1)",
            CONSOLE_TOKEN,
        ]
    ),
    _text,
)
_console_form = st.dictionaries(
    st.one_of(
        st.sampled_from(
            ["csrf", "token", "scope", "target", "for", "reason", "back", "key", "all", "id"]
        ),
        _text,
    ),
    _form_value,
    max_size=6,
)
_console_query = st.dictionaries(
    st.one_of(st.sampled_from(["kind", "id", "next", "page", "limit", "topic"]), _text),
    st.one_of(st.sampled_from(["event", "silence", "", "-1", "1e309", "%00"]), _text),
    max_size=3,
)


@dataclass(frozen=True)
class ConsoleTarget:
    client: httpx.Client
    sid: str
    csrf: str


@contextlib.contextmanager
def _console() -> Iterator[ConsoleTarget]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        separate_store(Path(tmp) / "state") as target,
        NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emu,
        receiver.running(Path(tmp) / "receiver.sqlite3") as triage,
    ):
        triage.faults.reject_next(400)  # one dead row, so the deliveries page lists one
        state = Path(tmp) / "state"
        dsn = {"state_database": target.conninfo} if isinstance(target, db.Dsn) else {}
        config = settings_for(
            emu.url,
            state,
            http_token=CONSOLE_TOKEN,
            relay_url=triage.url,
            cadence_debounce="0s",
            **dsn,
        )
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            emu.wait_for_subscribers(1)
            for n, title in enumerate(["<script>x</script>", "\x1b[31mred", "Disk \u202e"]):
                emu.publish("alerts", f"body {n}", title=title, priority=3 + n)
            wait_until(lambda: _count(target, "SELECT count(*) FROM inbox") == 3)
            base = f"http://127.0.0.1:{running.daemon.http_port}"
            with httpx.Client(base_url=base, timeout=30.0, follow_redirects=False) as client:
                form = client.get("/console/login").text
                login_csrf = _csrf_in(form)
                answer = client.post(
                    "/console/login", data={"csrf": login_csrf, "token": CONSOLE_TOKEN}
                )
                assert answer.status_code == 303, answer.text
                sid = client.cookies[CONSOLE_COOKIE]
                csrf = _csrf_in(client.get("/console/").text)
                client.cookies.clear()
                yield ConsoleTarget(client, sid, csrf)


@pytest.fixture
def console_target(shared: dict[object, Any], engine: str) -> ConsoleTarget:
    target: ConsoleTarget = _shared(shared, engine, _console)
    return target


def _csrf_in(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page[:300]
    return found.group(1)


@st.composite
def console_requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], dict[str, str], bool]:
    """(method, path with query, form, cookies, as_json): mostly a real session and CSRF token."""
    post = draw(st.booleans())
    path = draw(st.sampled_from(CONSOLE_POST if post else CONSOLE_GET))
    method = "POST" if post else "GET"
    if draw(st.integers(0, 5)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD"]))
    form = draw(_console_form) if method != "GET" else {}
    session = draw(st.sampled_from(["real", "real", "none", "forged"]))
    if session == "real" and method == "POST" and draw(st.integers(0, 2)):
        form["csrf"] = "real"  # resolved against the target in the test
    query = _encode(draw(_console_query))
    return method, path + query, form, {"session": session}, draw(st.integers(0, 3)) == 0


@pytest.mark.engines  # the feed's store, the daemon's
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(console_requests())
def test_no_input_to_any_console_route_yields_a_500(
    console_target: ConsoleTarget,
    request_parts: tuple[str, str, dict[str, str], dict[str, str], bool],
) -> None:
    method, path, form, how, as_json = request_parts
    client = console_target.client
    client.cookies.clear()
    # A fresh connection each time: a pooled one the server closed while idle (uvicorn's 5 s
    # keep-alive) would fail the request on the client's side, which is no answer at all.
    headers: dict[str, str] = {"Connection": "close"}
    if how["session"] == "real" and not path.startswith("/console/logout"):
        headers["Cookie"] = f"{CONSOLE_COOKIE}={console_target.sid}"  # logout would end it
    elif how["session"] == "forged":
        headers["Cookie"] = f"{CONSOLE_COOKIE}=forged-{len(path)}"
    if path.startswith("/v1/"):
        headers["Authorization"] = f"Bearer {CONSOLE_TOKEN}"
    if form.get("csrf") == "real":
        form["csrf"] = console_target.csrf
    if as_json or path.startswith("/v1/"):
        body = json.dumps(form, ensure_ascii=False).encode("utf-8", "surrogatepass")
        headers["Content-Type"] = "application/json"
    else:
        body = _encode(form)[1:].encode("ascii")
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    response = client.request(method, path, headers=headers, content=body)
    client.cookies.clear()
    event(f"{how['session']} session, {method}: HTTP {response.status_code}")
    assert response.status_code < 500, (method, path, form, response.status_code, response.text)
