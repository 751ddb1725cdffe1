"""The relay's HTTP exchanges through the whole daemon, against receivers that misbehave on the wire.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ntfy_intake.store import audit
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, settings_for, wait_until

pytestmark = pytest.mark.one_engine("the relay's HTTP exchanges; the outbox is incidental")

UNSOLICITED_408 = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 7\r\n\r\ntimeout"
UNSOLICITED_408_CLOSE = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 7\r\n\r\ntimeout"
)


class UnsolicitedAnswerReceiver:
    """A triage receiver that answers each delivery with a reply naming its own key, then writes
    an unsolicited answer on the idle connection (as some servers and proxies do when they time
    an idle connection out), closing it afterwards when told to."""

    def __init__(self, unsolicited: bytes, *, close: bool, after: float = 0.02) -> None:
        self.unsolicited = unsolicited
        self.close = close
        self.after = after
        self.keys: list[str] = []
        self.unsolicited_sent = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                fields = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (
                        line.partition(b":") for line in head.split(b"\r\n")[1:] if line
                    )
                }
                await reader.readexactly(int(fields[b"content-length"]))
                key = fields[b"idempotency-key"].decode()
                self.keys.append(key)
                reply = json.dumps({"notify": {"text": f"reply for {key}"}}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(reply), reply)
                )
                await writer.drain()
                await asyncio.sleep(self.after)
                writer.write(self.unsolicited)
                await writer.drain()
                self.unsolicited_sent += 1
                if self.close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.transport.abort()

    @contextmanager
    def running(self) -> Iterator[str]:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        port: list[int] = []
        stop = asyncio.Event()

        async def main() -> None:
            server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
            port.append(server.sockets[0].getsockname()[1])
            started.set()
            await stop.wait()
            server.close()

        thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
        thread.start()
        assert started.wait(5)
        try:
            yield f"http://127.0.0.1:{port[0]}/triage"
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join(5)
            loop.close()


@pytest.mark.parametrize(
    ("unsolicited", "close"),
    [(UNSOLICITED_408, False), (UNSOLICITED_408_CLOSE, True)],
    ids=["keep-alive", "connection-close"],
)
def test_unsolicited_408_never_settles_a_delivery_on_another_ones_reply(
    tmp_path: Path, unsolicited: bytes, close: bool
) -> None:
    """Failure mode: an unsolicited 408 on an idle kept-alive connection is read as the next
    delivery's reply, and every reply after it as the one after's: deliveries settled on
    someone else's reply, and the agent's `notify.text` queued under the wrong `notify:<key>`
    (with `Connection: close`, a spurious failed attempt instead)."""
    state = tmp_path / "state"
    receiver = UnsolicitedAnswerReceiver(unsolicited, close=close)
    config = EmulatorConfig(keepalive_interval=1.0, request_limit=False)
    with NtfyEmulator(config).running() as emu, receiver.running() as relay_url:
        settings = settings_for(
            emu.url, state, relay_url=relay_url, cadence_debounce="0s", cadence_daily_cap="1000"
        )
        alerts = 12
        with DaemonThread(settings):
            emu.wait_for_subscribers(1)
            for n in range(alerts):
                emu.publish("alerts", f"host{n} down", title=f"Incident {n}")
                # Each reply's unsolicited 408 lands while its connection sits idle, before the
                # next alert is published (else it may cross the next request: HTTP/1.1's race).
                wait_until(
                    lambda n=n: receiver.unsolicited_sent > n, timeout=15, what=f"delivery {n}"
                )
                wait_until(
                    lambda n=n: len(owner_texts(state)) > n, timeout=15, what=f"reply {n} queued"
                )
    delivery_lines = [r for r in audit.read_records(state / "audit") if r["kind"] == "delivery"]
    keys = {str(r["delivery_key"]) for r in delivery_lines}
    assert len(keys) == alerts
    # Each delivery settled once, on its first attempt, on its own reply.
    assert Counter(receiver.keys) == Counter(dict.fromkeys(keys, 1))
    assert {(r["result"], r["attempt"], r["status"]) for r in delivery_lines} == {
        ("delivered", 1, 200)
    }
    assert owner_texts(state) == {f"notify:{key}": f"reply for {key}" for key in keys}


def owner_texts(state: Path) -> dict[str, str]:
    return {
        str(r["key"]): str(r["text"])
        for r in audit.read_records(state / "audit")
        if r["kind"] == "owner_message" and "text" in r and str(r["key"]).startswith("notify:")
    }
