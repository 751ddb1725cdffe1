"""The daemon (`ntfy-intake run` as a subprocess) against the real ntfy server: intake, resume across
SIGTERM and kill -9, ntfy itself killed mid-stream and restarted with and without its cache, cache
expiry while the daemon is down, bad credentials and ACL denials, and the drill.

ntfy's keepalive interval cannot go below 5 s, so the daemon is told the same.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from ntfy_intake.testbed import drill

from ..harness import (
    cursor_row,
    daemon_process,
    env_for,
    event_ids,
    notices,
    wait_until,
)
from ..real_ntfy import RealNtfy

pytestmark = [pytest.mark.real_ntfy, pytest.mark.slow]
MakeReal = Callable[..., RealNtfy]
CATCH_UP = 60.0


def env(server: RealNtfy, state: Path, **overrides: str) -> dict[str, str]:
    return env_for(
        server.url,
        state,
        ntfy_keepalive_interval="5s",
        cadence_debounce="0s",
        **overrides,
    )


def recorded(state: Path, ids: list[str]) -> Callable[[], bool]:
    return lambda: set(ids) <= set(event_ids(state))


def assert_exactly_once(state: Path, ids: list[str]) -> None:
    counts = Counter(event_ids(state))
    assert [i for i in ids if counts[i] != 1] == [], counts
    assert set(counts) == set(ids)


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 0


@contextmanager
def logged(environ: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The daemon, its log lines kept in `log` (read by the test, left for a failure's reader)."""
    with log.open("ab") as out, daemon_process(environ, stdout=out) as proc:
        yield proc


def wait_subscribed(log: Path) -> None:
    """Until the daemon has read its stream's `open` frame. Its store exists long before (on
    PostgreSQL a node first stands by and wins its term): a message published then predates
    the join time, and only the first start's backfill records it, which never makes it the
    cursor (a cursor is a stream event's id). Stopped then, the daemon leaves the join time as
    its cursor, and a resume by time has no message to probe: no gap is ever reported."""
    wait_until(lambda: '"intake.connected"' in log.read_text(), CATCH_UP, "the stream's open")


@pytest.mark.engines  # the daemon's store
def test_real_server_every_message_is_recorded_once_across_sigterm_and_kill9(
    make_real_ntfy: MakeReal, tmp_path: Path
) -> None:
    server = make_real_ntfy()
    state = tmp_path / "state"
    published: list[str] = []
    with logged(env(server, state), tmp_path / "first.log") as proc:
        wait_subscribed(tmp_path / "first.log")
        published += [server.publish("alerts", f"first #{n}")["id"] for n in range(10)]
        wait_until(recorded(state, published), CATCH_UP, "first batch")
        stop(proc)
    published += [server.publish("backups", f"while stopped #{n}")["id"] for n in range(5)]
    with daemon_process(env(server, state)) as proc:
        wait_until(recorded(state, published), CATCH_UP, "catch-up after SIGTERM")
        published += [server.publish("alerts", f"live #{n}")["id"] for n in range(5)]
        wait_until(recorded(state, published), CATCH_UP, "live after restart")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    published += [server.publish("alerts", f"while killed #{n}")["id"] for n in range(5)]
    with daemon_process(env(server, state)) as proc:
        wait_until(recorded(state, published), CATCH_UP, "catch-up after kill -9")
        stop(proc)
    assert_exactly_once(state, published)
    assert cursor_row(state)[0] == "id"


@pytest.mark.engines  # the daemon's store
def test_real_server_killed_mid_stream_and_restarted_with_its_cache_loses_nothing(
    make_real_ntfy: MakeReal, tmp_path: Path
) -> None:
    server = make_real_ntfy()
    state = tmp_path / "state"
    published: list[str] = []
    stop_publishing = threading.Event()

    def publish_steadily() -> None:
        n = 0
        while not stop_publishing.wait(0.05):
            n += 1
            try:
                published.append(server.publish("alerts", f"steady #{n}")["id"])
            except Exception:  # the server is down for a moment: that message was never accepted
                continue

    with logged(env(server, state), tmp_path / "first.log") as proc:
        wait_subscribed(tmp_path / "first.log")
        publisher = threading.Thread(target=publish_steadily)
        publisher.start()
        try:
            wait_until(lambda: len(published) >= 20, CATCH_UP, "traffic before the crash")
            server.kill9()
            server.start()  # same port, same cache file
            count = len(published)
            wait_until(lambda: len(published) >= count + 20, CATCH_UP, "traffic after")
        finally:
            stop_publishing.set()
            publisher.join(10)
        wait_until(recorded(state, published), CATCH_UP, "everything recorded")
        stop(proc)
    assert_exactly_once(state, published)
    assert notices(state, "gap") == []


def _utc(seconds: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _window(notice: dict[str, object]) -> tuple[dt.datetime, dt.datetime]:
    start, end = notice["window_start"], notice["window_end"]
    assert isinstance(start, str) and isinstance(end, str)
    return dt.datetime.fromisoformat(start), dt.datetime.fromisoformat(end)


@pytest.mark.engines  # the daemon's store
def test_real_server_restarted_without_its_cache_reports_the_gap_window(
    make_real_ntfy: MakeReal, tmp_path: Path
) -> None:
    server = make_real_ntfy()
    state = tmp_path / "state"
    with logged(env(server, state), tmp_path / "first.log") as proc:
        wait_subscribed(tmp_path / "first.log")
        before = server.publish("alerts", "recorded before the loss")
        wait_until(recorded(state, [before["id"]]), CATCH_UP, "first message")
        stop(proc)
    lost = server.publish("alerts", "published, then lost with the cache")
    server.kill9()
    server.restart(keep_cache=False)
    time.sleep(1.1)  # the next message gets a later server second than the lost one
    after = server.publish("alerts", "published after the loss")
    with logged(env(server, state), tmp_path / "after.log") as proc:
        wait_until(recorded(state, [after["id"]]), CATCH_UP, "replay after the loss")
        wait_until(lambda: notices(state, "gap"), CATCH_UP, "gap notice")
        stop(proc)
    (gap,) = notices(state, "gap")
    start, end = _window(gap)
    # The window covers the lost message and lies within what the daemon can know: it starts at
    # the last frame seen (persisted at most once a second, so it may start a little earlier,
    # the safe direction) and ends at the oldest message the server still holds.
    slack = dt.timedelta(seconds=5)
    assert _utc(before["time"]) - slack <= start <= _utc(lost["time"]) <= end <= _utc(after["time"])
    assert lost["id"] not in event_ids(state)


@pytest.mark.engines  # the daemon's store
def test_real_server_cache_expiry_while_the_daemon_is_down_reports_the_gap(
    make_real_ntfy: MakeReal, tmp_path: Path
) -> None:
    server = make_real_ntfy(cache_duration="5s", extra={"manager-interval": "5s"})
    state = tmp_path / "state"
    with logged(env(server, state, ntfy_cache_duration="5s"), tmp_path / "first.log") as proc:
        wait_subscribed(tmp_path / "first.log")
        first = server.publish("alerts", "recorded, then expires")
        wait_until(recorded(state, [first["id"]]), CATCH_UP, "first message")
        stop(proc)
    expired = server.publish("alerts", "published while down, expires unseen")
    wait_until(lambda: not server_holds(server, expired["id"]), 30, "ntfy prunes it")
    with logged(env(server, state, ntfy_cache_duration="5s"), tmp_path / "after.log") as proc:
        wait_until(lambda: notices(state, "gap"), CATCH_UP, "gap notice")
        stop(proc)
    (gap,) = notices(state, "gap")
    start, end = _window(gap)
    assert start <= _utc(expired["time"]) <= end


def server_holds(server: RealNtfy, message_id: str) -> bool:
    response = httpx.get(f"{server.url}/alerts,backups/json", params={"poll": "1"}, timeout=10)
    return message_id in response.text


@pytest.mark.engines  # the daemon's store
@pytest.mark.parametrize("failure", ["bad token", "acl denial"])
def test_real_server_auth_failure_keeps_the_cursor_and_backs_off(
    make_real_ntfy: MakeReal, tmp_path: Path, failure: str
) -> None:
    server = make_real_ntfy(auth=True, default_access="deny-all")
    server.add_user("intake")
    server.grant("intake", "alerts", "read-only")
    server.grant("intake", "backups", "read-only")
    server.add_user("publisher")
    server.grant("publisher", "*", "write-only")
    good = server.add_token("intake")
    writer = server.add_token("publisher")
    state = tmp_path / "state"
    auth = {"Authorization": f"Bearer {writer}"}
    with logged(env(server, state, ntfy_token=good), tmp_path / "first.log") as proc:
        wait_subscribed(tmp_path / "first.log")
        first = server.publish("alerts", "before the failure", **auth)
        wait_until(recorded(state, [first["id"]]), CATCH_UP, "first message")
        stop(proc)
    saved = cursor_row(state)
    assert saved == ("id", first["id"])
    if failure == "bad token":
        bad = {"ntfy_token": "tk_" + "0" * 29}
    else:
        server.add_user("stranger")
        bad = {"ntfy_token": server.add_token("stranger")}  # valid, but may read nothing
    during = server.publish("backups", "published during the failure", **auth)
    log = tmp_path / "daemon.log"
    with log.open("wb") as out, daemon_process(env(server, state, **bad), stdout=out) as proc:
        # Identical error lines are rate-limited in the log; the reconnect schedule is not.
        wait_until(lambda: '"failures": 2' in log.read_text(), CATCH_UP, "two failed attempts")
        assert proc.poll() is None, "an auth failure must not stop the daemon"
        stop(proc)
    assert cursor_row(state) == saved
    expected = "http_401" if failure == "bad token" else "http_403"
    assert expected in log.read_text()
    # The owner hears once for the episode, told which kind of refusal it is.
    (told,) = notices(state, "subscribe_refused")
    assert told["category"] == ("credentials" if failure == "bad token" else "acl")
    with daemon_process(env(server, state, ntfy_token=good)) as proc:
        wait_until(recorded(state, [first["id"], during["id"]]), CATCH_UP, "resume")
        stop(proc)
    assert_exactly_once(state, [first["id"], during["id"]])


def test_drill_against_the_real_server_passes(make_real_ntfy: MakeReal) -> None:
    server = make_real_ntfy()
    out = io.StringIO()
    verdict = drill.run(
        kills=4, seed=11, ntfy_url=server.url, topic="drill", out=out, progress=None
    )
    assert verdict == 0, out.getvalue()
    assert "PASS" in out.getvalue()
