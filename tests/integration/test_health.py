"""Silence is never mistaken for health: status/check, the keepalive watchdog, systemd pings."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ntfy_intake.runtime.sdnotify import Notifier
from ntfy_intake.store import inbox
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from .. import ports
from ..harness import DaemonThread, env_for, event_ids, notices, query, settings_for, wait_until

pytestmark = [pytest.mark.engines, pytest.mark.emulator(keepalive_interval=0.5)]


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ntfy_intake", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def fast_env(emu: NtfyEmulator, state: Path) -> dict[str, str]:
    env = env_for(
        emu.url,
        state,
        ntfy_keepalive_interval="1s",
        ntfy_keepalive_timeout="1500ms",
        ntfy_dead_after="3s",
    )
    return {"PATH": "/usr/bin:/bin", **env}


def test_check_tells_healthy_quiet_from_dead_quiet_and_recovers(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    env = fast_env(emu, tmp_path)
    config = settings_for(
        emu.url,
        tmp_path,
        ntfy_keepalive_interval="1s",
        ntfy_keepalive_timeout="1500ms",
        ntfy_dead_after="3s",
    )
    with DaemonThread(config) as running:
        emu.wait_for_subscribers(1)
        assert running.daemon is not None
        wait_until(
            lambda: cli(env, "check").returncode == 0, timeout=30, what="healthy-quiet check"
        )
        quiet = json.loads(cli(env, "status", "--json").stdout)
        assert quiet["intake"]["state"] == "live" and quiet["inbox"]["events"] == 0
        emu.faults.silence(True)
        wait_until(lambda: cli(env, "check").returncode == 1, timeout=30, what="dead-quiet check")
        dead = json.loads(cli(env, "status", "--json").stdout)
        assert dead["intake"]["state"] in ("reconnecting", "dead")
        wait_until(lambda: notices(tmp_path, "intake_dead"), timeout=30, what="intake_dead notice")
        emu.faults.silence(False)
        emu.faults.drop_connections()
        wait_until(lambda: cli(env, "check").returncode == 0, timeout=30, what="recovery")
        wait_until(lambda: notices(tmp_path, "intake_recovered"), timeout=30)
    assert len(notices(tmp_path, "intake_dead")) == 1
    assert len(notices(tmp_path, "intake_recovered")) == 1


def test_check_fails_when_the_daemon_is_not_running(emu: NtfyEmulator, tmp_path: Path) -> None:
    env = fast_env(emu, tmp_path)
    config = settings_for(emu.url, tmp_path)
    with DaemonThread(config):
        emu.wait_for_subscribers(1)
    result = cli(env, "check")
    assert result.returncode == 1 and "not running" in result.stdout


@pytest.mark.one_engine("the keepalive watchdog on the wire")
def test_silenced_stream_is_reconnected_within_keepalive_timeout_plus_one_backoff_step(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    config = settings_for(
        emu.url, tmp_path, ntfy_keepalive_interval="1s", ntfy_keepalive_timeout="1500ms"
    )
    with DaemonThread(config, backoff_base=1.0) as running:
        emu.wait_for_subscribers(1)
        assert running.daemon is not None
        wait_until(lambda: running.daemon.health.connections == 1)
        connects = running.daemon.health.connections
        emu.faults.silence(True)
        silenced_at = time.monotonic()
        emu.faults.silence(False)  # only the open stream stays silent; the next one is healthy
        wait_until(lambda: running.daemon.health.connections > connects, timeout=30)
        elapsed = time.monotonic() - silenced_at
    # keepalive_timeout (1.5 s) + first backoff step (at most base = 1 s) + slack for a loaded
    # machine; a plain read timeout or a missing watchdog would take tens of seconds, or forever.
    assert elapsed < 1.5 + 1.0 + 3.0, elapsed
    assert running.daemon.health.watchdog_drops == 1


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.messages: list[str] = []

    def drain(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                return self.messages

    def count(self, field: str) -> int:
        return sum(1 for m in self.drain() if field in m.split("\n"))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


@pytest.mark.one_engine("systemd watchdog pings")
def test_watchdog_pings_stop_when_the_loop_is_wedged(
    emu: NtfyEmulator, tmp_path: Path, notify_socket: NotifySocket
) -> None:
    config = settings_for(emu.url, tmp_path / "state")
    notifier = Notifier(str(tmp_path / "notify.sock"))
    with DaemonThread(config, notifier=notifier, watchdog_interval=0.2) as running:
        emu.wait_for_subscribers(1)
        wait_until(lambda: notify_socket.count("WATCHDOG=1") >= 3, timeout=30)
        assert notify_socket.messages[0].startswith("READY=1")
        assert running.daemon is not None
        running.daemon.wedge_for_test()
        time.sleep(1.5)  # the heartbeat goes stale (> max(2 intervals, 1 s))
        before = notify_socket.count("WATCHDOG=1")
        time.sleep(1.0)
        assert notify_socket.count("WATCHDOG=1") == before, "pings continued while wedged"
        running.daemon.wedge_for_test(
            False
        )  # let the test shut down; the stuck ticker is cancelled
    assert any("STOPPING=1" in m for m in notify_socket.drain())


@pytest.mark.one_engine("systemd watchdog pings")
def test_watchdog_pings_continue_during_a_remote_outage(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    port = ports.free_port()  # an ntfy URL where nothing listens: a remote outage
    config = settings_for(f"http://127.0.0.1:{port}", tmp_path / "state")
    notifier = Notifier(str(tmp_path / "notify.sock"))
    with DaemonThread(
        config, notifier=notifier, watchdog_interval=0.2, backoff_base=0.5
    ) as running:
        assert running.daemon is not None
        wait_until(lambda: running.daemon.health.attempts >= 3, timeout=30)
        first = notify_socket.count("WATCHDOG=1")
        # Pings keep coming (every 0.2 s) while intake backs off against a dead server.
        wait_until(lambda: notify_socket.count("WATCHDOG=1") >= first + 3, timeout=10)
        assert running.daemon.health.state in ("backoff", "connecting")
    assert notify_socket.messages[0].startswith("READY=1")


@pytest.mark.one_engine("an outbound ping over HTTP")
def test_dead_mans_switch_is_pinged_only_while_healthy(emu: NtfyEmulator, tmp_path: Path) -> None:
    pings: list[float] = []

    async def ping(request: Request) -> Response:
        pings.append(time.monotonic())
        return PlainTextResponse("OK")

    app = Starlette(routes=[Route("/ping/{check}", ping)])
    with _serve.serving(app) as base:
        config = settings_for(
            emu.url,
            tmp_path,
            ntfy_keepalive_interval="1s",
            ntfy_keepalive_timeout="1500ms",
            health_ping_url=f"{base}/ping/check-uuid",
            health_ping_interval="1s",
        )
        with DaemonThread(config) as running:
            emu.wait_for_subscribers(1)
            wait_until(lambda: len(pings) >= 2, timeout=30, what="pings while healthy")
            emu.faults.silence(True)
            assert running.daemon is not None
            wait_until(lambda: running.daemon.assess_health().healthy is False, timeout=30)
            time.sleep(1.2)  # one ping interval for a ping already in flight to land
            count = len(pings)
            time.sleep(2.5)
            assert len(pings) == count, "pinged while intake was dead"
            emu.faults.silence(False)
            emu.faults.drop_connections()
            wait_until(lambda: len(pings) > count, timeout=30, what="pings after recovery")


@pytest.mark.one_engine("task supervision")
def test_a_crashed_task_stops_the_daemon_with_a_failure_instead_of_hanging(
    emu: NtfyEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failure mode: a bug kills the writer and the daemon lingers, alive but recording nothing."""

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected bug in the inbox transaction")

    monkeypatch.setattr(inbox, "record_batch", broken)
    running = DaemonThread(settings_for(emu.url, tmp_path)).start()
    emu.wait_for_subscribers(1)
    emu.publish("alerts", "disk full", title="Disk")
    assert running._thread is not None
    running._thread.join(timeout=20)
    assert not running._thread.is_alive(), "the daemon kept running without its writer"
    assert running.daemon is not None and running.daemon.failed
    assert query(tmp_path, "SELECT count(*) FROM inbox") == [(0,)]  # replayed on restart instead


def test_http_port_in_use_leaves_intake_running_and_health_degraded_everywhere(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listen = f"127.0.0.1:{port}"
        config = settings_for(emu.url, tmp_path, http_listen=listen)
        env = {**fast_env(emu, tmp_path), "NTFY_INTAKE_HTTP_LISTEN": listen}
        with DaemonThread(config) as running:
            emu.wait_for_subscribers(1)
            event = emu.publish("alerts", "disk full", title="Disk")["id"]
            wait_until(lambda: event in event_ids(tmp_path))
            daemon = running.daemon
            assert daemon is not None
            # The HTTP surface loads once intake has caught up (supervisor.after_subscribing).
            wait_until(lambda: daemon.http_error is not None, what="the bind failure")
            # Read until one report says both (a starved machine's stream may reconnect between
            # two reads: "reconnecting" rightly outranks "degraded" for a moment).
            wait_until(
                lambda: (
                    (report := json.loads(cli(env, "status", "--json").stdout))["health"]["state"]
                    == "degraded"
                    and report["intake"]["state"] == "live"
                ),
                what="status --json says degraded, intake live",
            )
            # Each view is read again until it agrees: on a starved machine the stream may
            # reconnect meanwhile, and "reconnecting" rightly outranks "degraded" for a moment.
            wait_until(
                lambda: (
                    (check := cli(env, "check")).returncode == 1
                    and check.stdout.startswith("unhealthy: degraded: HTTP surface down")
                ),
                what="check says degraded: HTTP surface down",
            )
            wait_until(
                lambda: "degraded" in cli(env, "status").stdout.splitlines()[0].lower(),
                what="status says degraded",
            )
            assert daemon.metrics_snapshot()["health_state"] == "degraded"
            assert daemon.vitals.status_line("intake live: last frame 0s ago").startswith(
                "degraded: HTTP surface down"
            )
            # Intake goes on: a second alert is still recorded.
            second = emu.publish("alerts", "disk fuller", title="Disk")["id"]
            wait_until(lambda: second in event_ids(tmp_path))


def test_check_is_unhealthy_once_a_reconnect_fails_though_the_last_frame_is_fresh(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    # keepalive_timeout is long, so the last frame stays "fresh" for the whole outage.
    overrides = {
        "ntfy_keepalive_interval": "1s",
        "ntfy_keepalive_timeout": "60s",
        "ntfy_dead_after": "120s",
    }
    env = {"PATH": "/usr/bin:/bin", **env_for(emu.url, tmp_path, **overrides)}
    with DaemonThread(settings_for(emu.url, tmp_path, **overrides), backoff_base=0.5):
        emu.wait_for_subscribers(1)
        wait_until(lambda: cli(env, "check").returncode == 0, what="healthy at first")
        emu.faults.fail_subscribes(10_000, status=503)
        emu.faults.drop_connections()
        wait_until(lambda: cli(env, "check").returncode == 1, timeout=15, what="unhealthy")
        check = cli(env, "check").stdout
        assert check.startswith("unhealthy: reconnecting")
        assert "last error HTTP 503" in check and " s ago)" in check
        text = cli(env, "status").stdout
        assert "healthy" not in text.split("\n")[0].lower().replace("unhealthy", "")
        assert "RECONNECTING" in text.split("\n")[0]
        emu.faults.clear()
        wait_until(lambda: cli(env, "check").returncode == 0, timeout=30, what="recovered")
        report = json.loads(cli(env, "status", "--json").stdout)
        assert report["health"] == {"state": "live", "healthy": True, "reasons": []}
        # The error is still shown, dated, and marked as history.
        assert report["intake"]["last_error"].startswith("HTTP 503")
        assert report["intake"]["last_error_age_s"] is not None
        assert report["intake"]["last_error_current"] is False
        assert "frames have arrived since" in cli(env, "status").stdout


def test_check_never_prints_none_for_a_frame_that_never_came(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{ports.free_port()}"
    env = {"PATH": "/usr/bin:/bin", **env_for(url, tmp_path)}
    with DaemonThread(settings_for(url, tmp_path)) as running:
        assert running.daemon is not None
        wait_until(lambda: running.daemon.health.attempts >= 2, what="failed attempts")
        wait_until(
            lambda: (
                json.loads(cli(env, "status", "--json").stdout or "{}")
                .get("daemon", {})
                .get("running")
            ),
            what="a health snapshot",
        )
        check = cli(env, "check")
        assert check.returncode == 1
        assert "None" not in check.stdout
        assert "no frame since start" in check.stdout
        assert re.search(r"^last frame\s+never$", cli(env, "status").stdout, re.M)


@pytest.mark.one_engine("the HTTP surface; test_vitals_round_trips has the counts on both")
def test_metrics_and_healthz_report_the_running_daemon(emu: NtfyEmulator, tmp_path: Path) -> None:
    config = settings_for(emu.url, tmp_path, ntfy_keepalive_interval="1s")
    with DaemonThread(config) as running:
        emu.wait_for_subscribers(1)
        event = emu.publish("alerts", "disk full", title="Disk")["id"]
        wait_until(lambda: event in event_ids(tmp_path))
        assert running.daemon is not None
        wait_until(lambda: running.daemon.http_port is not None)
        base = f"http://127.0.0.1:{running.daemon.http_port}"
        wait_until(lambda: httpx.get(f"{base}/healthz").status_code == 200, timeout=30)
        assert httpx.get(f"{base}/healthz").json() == {"status": "live", "intake": "live"}
        text = httpx.get(f"{base}/metrics").text
        emu.faults.silence(True)
        wait_until(lambda: httpx.get(f"{base}/healthz").status_code == 503, timeout=30)
        body = httpx.get(f"{base}/healthz").json()
        assert body["status"] in ("reconnecting", "dead")
        assert body["reasons"] and "last frame" in body["reasons"][0]
        emu.faults.silence(False)
    samples = {
        line.split(" ")[0]: line.split(" ")[1]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert float(samples["ntfy_intake_events_recorded_total"]) == 1.0
    assert samples['ntfy_intake_intake_state{state="live"}'] == "1.0"
    assert samples['ntfy_intake_health_state{state="live"}'] == "1.0"
    assert samples["ntfy_intake_healthy"] == "1.0"
    assert float(samples["ntfy_intake_audit_latch"]) == 0.0
    assert "ntfy_intake_last_frame_age_seconds" in samples


@pytest.mark.one_engine("ntfy authentication on the wire")
def test_bearer_token_reaches_an_authenticated_ntfy_and_a_wrong_one_keeps_the_cursor(
    tmp_path: Path,
) -> None:
    token = "tk_" + "a" * 29
    with NtfyEmulator(
        EmulatorConfig(keepalive_interval=1.0, tokens={token: {"alerts", "backups"}})
    ).running() as emu:
        good = settings_for(emu.url, tmp_path, ntfy_token=token)
        with DaemonThread(good):
            emu.wait_for_subscribers(1)
            event = emu.publish("alerts", "disk full", title="Disk")["id"]
            wait_until(lambda: event in event_ids(tmp_path))
            wait_until(lambda: query(tmp_path, "SELECT kind, value FROM cursor") == [("id", event)])
        wrong = settings_for(emu.url, tmp_path, ntfy_token="tk_" + "b" * 29)
        before = len(emu.subscribe_log)
        with DaemonThread(wrong, backoff_base=0.05) as running:
            assert running.daemon is not None
            wait_until(lambda: running.daemon.health.failures.get("http_401", 0) >= 3, timeout=30)
        statuses = [e["status"] for e in emu.subscribe_log[before:]]
        assert set(statuses) == {401}
    assert query(tmp_path, "SELECT kind, value FROM cursor") == [("id", event)]
    assert notices(tmp_path, "fallback_400") == []


@pytest.mark.one_engine("systemd status lines")
def test_systemd_status_line_says_the_health_state_once_and_does_not_repeat_itself(
    emu: NtfyEmulator, tmp_path: Path, notify_socket: NotifySocket
) -> None:
    config = settings_for(emu.url, tmp_path / "state")
    notifier = Notifier(str(tmp_path / "notify.sock"))
    with DaemonThread(config, notifier=notifier, watchdog_interval=0.2):
        emu.wait_for_subscribers(1)
        wait_until(
            lambda: any(m.startswith("STATUS=live;") for m in notify_socket.drain()),
            timeout=30,
            what="a live STATUS line",
        )
    line = next(m for m in notify_socket.messages if m.startswith("STATUS=live;"))
    assert re.fullmatch(
        r"STATUS=live; last frame \d+\.\d s ago; \d+ recorded this run; cursor \S+", line
    ), line
    assert line.count("live") == 1


@pytest.mark.one_engine("a connection failure on the wire")
def test_connection_failure_names_the_url_ntfys_error_and_the_setting_to_check(
    tmp_path: Path,
) -> None:
    """A wrong path prefix used to read `HTTP 404` and nothing else."""
    config = EmulatorConfig(
        keepalive_interval=1.0, tokens={"tk_" + "a" * 29: ["alerts"]}, request_limit=False
    )
    with NtfyEmulator(config).running() as emu:
        _failures_of_a_misconfigured_daemon(emu, tmp_path)


def _failures_of_a_misconfigured_daemon(emu: NtfyEmulator, tmp_path: Path) -> None:
    wrong_prefix = f"{emu.url}/ntfy"
    env = {"PATH": "/usr/bin:/bin", **env_for(wrong_prefix, tmp_path)}
    with DaemonThread(settings_for(wrong_prefix, tmp_path), backoff_base=0.5):
        wait_until(lambda: "HTTP 404" in cli(env, "status").stdout, timeout=15, what="a 404")
        last = json.loads(cli(env, "status", "--json").stdout)["intake"]["last_error"]
    assert last.startswith(f"HTTP 404 from {wrong_prefix}/alerts,backups/json")
    assert "ntfy says: 40401 page not found" in last
    assert "check ntfy.url (it has the path prefix '/ntfy')" in last
    env = {"PATH": "/usr/bin:/bin", **env_for(emu.url, tmp_path)}
    with DaemonThread(settings_for(emu.url, tmp_path), backoff_base=0.5):
        wait_until(lambda: "HTTP 403" in cli(env, "status").stdout, timeout=15, what="a 403")
        last = json.loads(cli(env, "status", "--json").stdout)["intake"]["last_error"]
    assert "40301 forbidden" in last and "may not read topic(s) alerts, backups" in last
