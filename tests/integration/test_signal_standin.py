"""The signal-cli-rest-api stand-in over real loopback sockets: the behaviours the owner channel
must survive (201, 400, 429, partial failure, ambiguous timeout, outage)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.sync.client import connect

from ntfy_intake.testbed import signal_standin
from ntfy_intake.testbed.signal_standin import SignalFaults, SignalHandle

OWNER = "+31600000001"
PARTNER = "+31600000002"
SENDER = "+31600000000"


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """One client for the module: a new client per request costs tens of milliseconds."""
    with httpx.Client(timeout=5.0) as client:
        yield client


def send(
    http: httpx.Client,
    handle: SignalHandle,
    message: str = "[sev 4] alerts: 'Disk'",
    recipients: list[str] | None = None,
    *,
    timeout: float = 5.0,
) -> httpx.Response:
    body = {"message": message, "number": SENDER, "recipients": recipients or [OWNER]}
    return http.post(f"{handle.url}/v2/send", json=body, timeout=timeout)


@pytest.fixture(scope="module")
def shared_signal() -> Iterator[SignalHandle]:
    with signal_standin.running() as handle:
        yield handle


@pytest.fixture
def signal(shared_signal: SignalHandle) -> SignalHandle:
    shared_signal.reset()
    return shared_signal


def test_send_is_201_with_timestamp_and_recorded(http: httpx.Client, signal: SignalHandle) -> None:
    response = send(http, signal, recipients=[OWNER, PARTNER])
    assert response.status_code == 201
    assert response.json().keys() == {"timestamp"}
    assert response.json()["timestamp"].isdigit()
    [sent] = signal.messages()
    assert (sent.number, sent.recipients, sent.message, sent.failed) == (
        SENDER,
        (OWNER, PARTNER),
        "[sev 4] alerts: 'Disk'",
        (),
    )


@pytest.mark.parametrize(
    "body",
    [
        {"message": "x", "number": SENDER},
        {"message": "x", "number": SENDER, "recipients": []},
        {"message": "x", "recipients": [OWNER]},
        {"number": SENDER, "recipients": [OWNER]},
        {"message": "x", "number": SENDER, "recipients": [OWNER], "text_mode": "bold"},
        ["not", "an", "object"],
    ],
)
def test_invalid_send_is_400_and_sends_nothing(
    http: httpx.Client, signal: SignalHandle, body: object
) -> None:
    response = http.post(f"{signal.url}/v2/send", json=body)
    assert response.status_code == 400
    assert isinstance(response.json()["error"], str)
    assert signal.messages() == []


@pytest.mark.parametrize("status", [400, 500])
def test_injected_failure_sends_nothing(
    http: httpx.Client, signal: SignalHandle, status: int
) -> None:
    signal.faults.fail_next(1, status=status)
    assert send(http, signal).status_code == status
    assert signal.messages() == []
    assert send(http, signal).status_code == 201
    assert len(signal.messages()) == 1


def test_rate_limited_is_429_with_retry_after(http: httpx.Client, signal: SignalHandle) -> None:
    signal.faults.fail_next(2, status=429, retry_after=30)
    for _ in range(2):
        limited = send(http, signal)
        assert limited.status_code == 429
        assert limited.headers["retry-after"] == "30"
        assert "rate limit" in limited.json()["error"]
    assert signal.messages() == []


def test_partial_failure_is_201_listing_failed_recipients(
    http: httpx.Client, signal: SignalHandle
) -> None:
    signal.faults.partial_failure_next(1, recipients=[PARTNER])
    response = send(http, signal, recipients=[OWNER, PARTNER])
    assert response.status_code == 201
    assert [e["recipient"] for e in response.json()["errors"]] == [PARTNER]
    [sent] = signal.messages()
    assert (sent.recipients, sent.failed) == ((OWNER,), (PARTNER,))
    assert "errors" not in send(http, signal, recipients=[PARTNER]).json()


def test_silent_partial_failure_is_a_bare_201(http: httpx.Client, signal: SignalHandle) -> None:
    signal.faults.partial_failure_next(1, listed=False)
    response = send(http, signal, recipients=[OWNER, PARTNER])
    assert response.status_code == 201
    assert response.json().keys() == {"timestamp"}
    assert signal.messages()[0].recipients == (OWNER,)


def test_every_recipient_failing_is_400_and_sends_nothing(
    http: httpx.Client, signal: SignalHandle
) -> None:
    signal.faults.partial_failure_next(1, recipients=[OWNER])
    assert send(http, signal, recipients=[OWNER]).status_code == 400
    assert signal.messages() == []


def test_stall_then_repeat_is_sent_twice(http: httpx.Client, signal: SignalHandle) -> None:
    signal.faults.stall_next(1, 1.0)
    with pytest.raises(httpx.ReadTimeout):
        send(http, signal, timeout=0.3)
    assert send(http, signal).status_code == 201
    sent = signal.messages()
    assert [m.message for m in sent] == ["[sev 4] alerts: 'Disk'"] * 2


def test_down_answers_503_until_back_up(http: httpx.Client, signal: SignalHandle) -> None:
    signal.faults.down(True)
    assert send(http, signal).status_code == 503
    assert http.get(f"{signal.url}/v1/about").status_code == 503
    assert signal.messages() == []
    signal.faults.down(False)
    assert http.get(f"{signal.url}/v1/about").status_code == 200
    assert send(http, signal).status_code == 201


def test_about_looks_like_signal_cli_rest_api(http: httpx.Client, signal: SignalHandle) -> None:
    about = http.get(f"{signal.url}/v1/about").json()
    assert about["versions"] == ["v1", "v2"]
    assert about["mode"] == "normal"


def test_messages_endpoint_lists_recorded_sends(http: httpx.Client, signal: SignalHandle) -> None:
    send(http, signal, "first")
    signal.faults.partial_failure_next(1, recipients=[PARTNER])
    send(http, signal, "second", [OWNER, PARTNER])
    listed = http.get(f"{signal.url}/_standin/messages").json()
    assert [(m["message"], m["recipients"], m["failed"]) for m in listed] == [
        ("first", [OWNER], []),
        ("second", [OWNER], [PARTNER]),
    ]
    assert all(isinstance(m["at"], float) for m in listed)


def test_faults_passed_in_are_the_handles(
    http: httpx.Client,
) -> None:
    faults = SignalFaults()
    with signal_standin.running(faults) as handle:
        assert handle.faults is faults
        faults.down()
        assert send(http, handle).status_code == 503


# -- the receive API (bbernhard/signal-cli-rest-api src/api/api.go `Receive`: normal/native mode
# answers a JSON array, json-rpc mode a WebSocket on the same path; envelope fields as in
# AsamK/signal-cli src/main/java/org/asamk/signal/json/JsonMessageEnvelope.java,
# JsonDataMessage.java and JsonQuote.java) ------------------------------------------------------


def test_send_timestamps_are_distinct_and_recorded(
    http: httpx.Client, signal: SignalHandle
) -> None:
    stamps = [int(send(http, signal).json()["timestamp"]) for _ in range(5)]
    assert len(set(stamps)) == 5
    assert [m.timestamp for m in signal.messages()] == stamps


def test_receive_returns_envelopes_once_in_the_real_shape(
    http: httpx.Client, signal: SignalHandle
) -> None:
    sent = int(send(http, signal).json()["timestamp"])
    signal.inbox.inject(SENDER, OWNER, "ack", quote=sent)
    signal.inbox.inject(SENDER, PARTNER, "status")
    first = http.get(f"{signal.url}/v1/receive/{SENDER}")
    assert first.status_code == 200
    items = first.json()
    assert [i["account"] for i in items] == [SENDER, SENDER]
    envelope = items[0]["envelope"]
    assert {"source", "sourceNumber", "sourceUuid", "timestamp", "dataMessage"} <= envelope.keys()
    assert envelope["sourceNumber"] == OWNER
    assert envelope["dataMessage"]["message"] == "ack"
    assert envelope["dataMessage"]["quote"]["id"] == sent
    assert "quote" not in items[1]["envelope"]["dataMessage"]
    # Receive removes what it returned: a second call gets nothing.
    assert http.get(f"{signal.url}/v1/receive/{SENDER}").json() == []
    assert http.get(f"{signal.url}/v1/receive/{OWNER}").json() == []


def test_receive_is_503_while_down_and_keeps_the_queue(
    http: httpx.Client, signal: SignalHandle
) -> None:
    signal.inbox.inject(SENDER, OWNER, "help")
    signal.faults.down()
    assert http.get(f"{signal.url}/v1/receive/{SENDER}").status_code == 503
    signal.faults.down(False)
    [item] = http.get(f"{signal.url}/v1/receive/{SENDER}").json()
    assert item["envelope"]["dataMessage"]["message"] == "help"


def test_inject_endpoint_queues_a_reply(http: httpx.Client, signal: SignalHandle) -> None:
    answer = http.post(
        f"{signal.url}/_standin/inject/{SENDER}",
        json={"source": OWNER, "message": "silence 2h", "quote": 12345},
    )
    assert answer.status_code == 201
    [item] = http.get(f"{signal.url}/v1/receive/{SENDER}").json()
    assert item == answer.json()
    bad = http.post(f"{signal.url}/_standin/inject/{SENDER}", json={"message": "x"})
    assert bad.status_code == 400


def test_websocket_pushes_one_envelope_per_text_frame(signal: SignalHandle) -> None:

    signal.inbox.inject(SENDER, OWNER, "ack")
    url = signal.url.replace("http://", "ws://") + f"/v1/receive/{SENDER}"
    with connect(url, open_timeout=5) as ws:
        first = json.loads(ws.recv(timeout=5))
        signal.inbox.inject(SENDER, OWNER, "details")
        second = json.loads(ws.recv(timeout=5))
    assert [
        first["envelope"]["dataMessage"]["message"],
        second["envelope"]["dataMessage"]["message"],
    ] == ["ack", "details"]
    assert signal.inbox.pending(SENDER) == 0
