"""Publisher profiles against the real ntfy server: each publisher's own publish
(tests/publishers.py) through `ntfy serve`, read by `ntfy-intake run` as a subprocess. The same
publishes run on the emulator in tests/integration/test_publisher_profiles.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from .. import publishers
from ..harness import daemon_process, env_for, event_ids, query, store_exists, wait_until
from ..real_ntfy import RealNtfy

pytestmark = [
    pytest.mark.real_ntfy,
    pytest.mark.slow,
    pytest.mark.one_engine("which incident a publish lands on is a rule; no storage"),
]
MakeReal = Callable[..., RealNtfy]
CATCH_UP = 60.0


def incidents_of(state: Path) -> dict[str, tuple[int, str, int]]:
    return {
        key: (severity, status, events)
        for key, severity, status, events in query(
            state, "SELECT key, severity, status, events FROM incidents"
        )
    }


def run_publishes(server: RealNtfy, state: Path, *, templates: bool) -> None:
    with daemon_process(env_for(server.url, state, ntfy_keepalive_interval="5s")) as proc:
        wait_until(lambda: store_exists(state), what="daemon start")
        time.sleep(0.5)  # joined at head: give the stream its open frame before publishing
        sent = publishers.publish_all(server.url, templates=templates)
        wait_until(lambda: len(event_ids(state)) == sent, CATCH_UP, "every event recorded")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0


def test_real_server_each_publishers_resolve_resolves_its_incident(
    make_real_ntfy: MakeReal, tmp_path: Path
) -> None:
    server = make_real_ntfy()
    state = tmp_path / "state"
    run_publishes(server, state, templates=False)
    assert incidents_of(state) == publishers.JSON_EXPECTED
    requests = query(state, "SELECT incident_key FROM outbox")
    assert sorted(key for (key,) in requests) == sorted(publishers.JSON_EXPECTED)


def test_real_server_templated_and_bridged_resolves_resolve_their_incidents(
    make_real_ntfy: MakeReal, tmp_path: Path
) -> None:
    server = make_real_ntfy()
    probe = httpx.post(
        f"{server.url}/probe?template=grafana", json=publishers.grafana_webhook("firing")
    )
    if probe.status_code != 200:  # ntfy before 2.14 has no shipped templates
        pytest.skip(f"this ntfy does not render ?template=grafana: {probe.text.strip()}")
    state = tmp_path / "state"
    run_publishes(server, state, templates=True)
    assert incidents_of(state) == publishers.EXPECTED
    requests = query(state, "SELECT incident_key FROM outbox")
    assert sorted(key for (key,) in requests) == sorted(publishers.EXPECTED)
