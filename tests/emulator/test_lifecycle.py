"""Starting and stopping the emulator (thread, same loop, foreground process), the programmatic
API, and the admin HTTP surface used when it runs as a separate process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator


def test_stop_cuts_open_streams(open_stream: Any) -> None:
    """Leaving running() ends open streams at once (as a dying server does) and frees the port."""
    emulator = NtfyEmulator(EmulatorConfig(keepalive_interval=30))
    with emulator.running() as emu:
        stream = open_stream(emu, "/t/json")
        stream.event()
        url = emu.url
    assert stream.ending() == "cut"
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/v1/health")
    with emulator.running() as again:  # restartable; the cache survives in the object
        assert again.url != "" and again.messages() == []


def test_running_twice_is_refused() -> None:
    emulator = NtfyEmulator()
    with emulator.running(), pytest.raises(RuntimeError, match="already running"):
        emulator.running().__enter__()


def test_publish_api_validates(emu: NtfyEmulator, clock: Any) -> None:
    for bad in ({"topic": "a/b"}, {"topic": "v1"}, {"topic": "t", "priority": 6}):
        with pytest.raises(ValueError, match="invalid"):
            emu.publish(**{"message": "x", **bad})
    forced = emu.publish("t", "  padded  ", message_id="abcdefABCDEF", time=5)
    assert (forced["id"], forced["time"], forced["message"]) == ("abcdefABCDEF", 5, "padded")
    assert forced["expires"] == 5 + 43200
    assert emu.publish("t")["message"] == "triggered"


def test_clock_controls(emu: NtfyEmulator, clock: Any) -> None:
    assert emu.publish("t", "a")["time"] == int(clock.now)
    emu.advance(100)
    assert emu.publish("t", "b")["time"] == int(clock.now) + 100
    emu.set_clock(lambda: 42.9)
    assert emu.publish("t", "c")["time"] == 42


def test_wait_for_subscribers(emu: NtfyEmulator, open_stream: Any) -> None:
    with pytest.raises(TimeoutError):
        emu.wait_for_subscribers(1, timeout=0.05)
    open_stream(emu, "/a,b/json")
    emu.wait_for_subscribers(1, topic="b", timeout=2)
    assert emu.subscriber_count() == 1 and emu.subscriber_count("c") == 0


def test_serving_on_the_callers_loop() -> None:
    """The async form shares the caller's loop; publish() fans out to the same loop."""

    async def scenario() -> list[str]:
        config = EmulatorConfig(keepalive_interval=0.1)
        async with (
            NtfyEmulator(config).serving() as emu,
            httpx.AsyncClient(base_url=emu.url, timeout=3) as client,
            client.stream("GET", "/t/json") as response,
        ):
            lines = response.aiter_lines()
            kinds = [json.loads(await anext(lines))["event"]]
            async with asyncio.timeout(2):
                await emu.wait_for_subscribers_async(1)
            emu.publish("t", "hello")
            kinds.append(json.loads(await anext(lines))["event"])
            kinds.append(json.loads(await anext(lines))["event"])
            return kinds

    assert asyncio.run(scenario()) == ["open", "message", "keepalive"]


def test_admin_surface(emu: NtfyEmulator, client: httpx.Client, open_stream: Any) -> None:
    """POST /v1/emulator/faults drives the same switches as emu.faults."""

    def faults(spec: object) -> httpx.Response:
        return client.post("/v1/emulator/faults", json=spec)

    a = client.put("/t", content=b"a").json()
    b = client.put("/t", content=b"b").json()
    assert [m["id"] for m in client.get("/v1/emulator/messages").json()] == [a["id"], b["id"]]
    assert client.get("/v1/emulator/messages", params={"topic": "x"}).json() == []
    assert faults({"force_400": 1}).json()["force_400"] == 1
    assert client.get("/t/json", params={"poll": "1", "since": a["id"]}).status_code == 400
    faults({"fail_subscribes": {"n": 1, "status": 429, "retry_after": 2}})
    limited = client.get("/t/json", params={"poll": "1"})
    assert (limited.status_code, limited.headers["retry-after"]) == (429, "2")
    faults({"evict": [a["id"]]})
    assert [m["id"] for m in emu.messages()] == [b["id"]]
    faults({"swap_next_live": 0.2, "duplicate_at_subscribe": True})
    snapshot = client.get("/v1/emulator/faults").json()
    assert (snapshot["swap_next_live"], snapshot["duplicate_at_subscribe"]) == (0.2, True)
    stream = open_stream(emu, "/t/json")
    stream.event()
    faults({"drop_connections": True})
    assert stream.ending() == "cut"
    faults({"silence": True})
    assert client.get("/v1/emulator/faults").json()["silenced"] is True
    faults({"clear": True, "evict": "all"})
    assert emu.messages() == [] and emu.faults.snapshot()["silenced"] is False
    log = client.get("/v1/emulator/subscribes").json()
    assert [entry["status"] for entry in log[:2]] == [400, 429]
    assert client.post("/v1/emulator/clock", json={"advance": 10}).json()["now"] == emu.now()
    assert client.post("/v1/emulator/prune").json() == {"pruned": []}
    bad = faults({"nonsense": 1})
    assert (bad.status_code, bad.json()["code"]) == (400, 40000)
    assert faults(["not", "an", "object"]).status_code == 400
    assert client.get("/v1/emulator/nope").status_code == 404


def test_admin_can_be_off(make_emulator: Callable[..., NtfyEmulator]) -> None:
    emu = make_emulator(admin=False)
    with httpx.Client(base_url=emu.url) as client:
        assert client.get("/v1/emulator/messages").status_code == 404
        assert client.post("/v1/emulator/faults", json={"silence": True}).status_code == 404


def test_subscribe_log_records_requests(emu: NtfyEmulator, client: httpx.Client) -> None:
    client.get(
        "/t/json",
        params={"poll": "1", "since": "all", "id": "abcdefABCDEF"},
        headers={"Authorization": "Bearer x"},
    )
    client.get("/t/json", params={"since": "bogus"})
    first, second = emu.subscribe_log
    assert first["path"] == "/t/json"
    assert first["params"] == {"since": "all", "poll": True, "id": "abcdefABCDEF"}
    assert first["query"] == {"poll": "1", "since": "all", "id": "abcdefABCDEF"}
    assert (first["auth"], first["status"], first["code"]) == (True, 200, None)
    assert (second["auth"], second["status"], second["code"]) == (False, 400, 40008)


@pytest.mark.slow
def test_serve_forever_process() -> None:
    """The `emulator` command's function: one line with the URL, serves, exits 0 on SIGTERM."""
    code = (
        "from ntfy_intake.testbed.emulator import EmulatorConfig, serve_forever;"
        "serve_forever('127.0.0.1', 0, EmulatorConfig(keepalive_interval=30))"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("ntfy-intake emulator listening on http://127.0.0.1:")
            url = line.split()[-1]
            with httpx.Client(base_url=url, timeout=3) as client:
                assert client.put("/t", content=b"x").status_code == 200
                with client.stream("GET", "/t/json") as stream:
                    assert json.loads(next(stream.iter_lines()))["event"] == "open"
                    process.send_signal(signal.SIGTERM)
                    assert process.wait(timeout=5) == 0
        finally:
            if process.poll() is None:
                process.kill()
