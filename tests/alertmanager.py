"""The real Prometheus Alertmanager for tests, built from its Go module by
`scripts/build-alertmanager` (`.ci/run` exports `ALERTMANAGER_BIN`).

`running_alertmanager(directory, webhook_url)` starts it on a free 127.0.0.1 port with its own
storage dir, gossip off (no cluster port), and a single webhook receiver: the URL ntfy's docs
give for Alertmanager, `<ntfy>/<topic>?template=alertmanager` (ntfy >= 2.14 renders the
webhook's JSON itself). Grouping by alertname with 1 s group_wait/group_interval, so a fired
alert reaches the receiver within about a second and its resolve within another. The process
is stopped by pid (SIGTERM, then SIGKILL).

Without a binary the tests skip naming why; under CI a missing binary is a failure unless
`.ci/run` recorded why it cannot be had here (`ALERTMANAGER_UNAVAILABLE`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from . import served_binary
from .real_ntfy import free_port

VERSION = (Path(__file__).parents[1] / "scripts" / "alertmanager-version").read_text().strip()


def binary() -> str | None:
    configured = os.environ.get("ALERTMANAGER_BIN")
    if configured:
        return configured
    # What scripts/build-alertmanager leaves behind, so a developer who ran it once needs no env.
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    built = Path(cache) / "ntfy-intake" / f"alertmanager-{VERSION}" / "alertmanager"
    return str(built) if os.access(built, os.X_OK) else None


def require_binary() -> str:
    found = binary()
    if found is not None:
        return found
    why = os.environ.get("ALERTMANAGER_UNAVAILABLE")
    if os.environ.get("CI") and not why:
        pytest.fail(
            "CI must run the Alertmanager tests: ALERTMANAGER_BIN is not set", pytrace=False
        )
    pytest.skip(
        f"real Alertmanager unavailable here: {why}"
        if why
        else "no Alertmanager: run scripts/build-alertmanager (needs Go >= 1.26) and export "
        "ALERTMANAGER_BIN=$(scripts/build-alertmanager)"
    )


def rfc3339(moment: datetime) -> str:
    """Whole seconds in UTC, as Alertmanager writes them back in its webhook."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Alertmanager:
    def __init__(self, binary_path: str, directory: Path, webhook_url: str) -> None:
        self.binary = binary_path
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.dir / "alertmanager.log"
        self.config = self.dir / "alertmanager.yml"
        # JSON is YAML: no quoting rules of our own to get wrong.
        config = {
            "global": {"resolve_timeout": "5m"},
            "route": {
                "receiver": "ntfy",
                "group_by": ["alertname"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {"name": "ntfy", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}
            ],
        }
        self.config.write_text(json.dumps(config, indent=2))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Alertmanager:
        argv = [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip: nothing listens beyond loopback
            "--log.level=debug",
        ]
        ready = f"{self.url}/-/ready"
        self.proc = served_binary.start(
            argv, self.log_path, ready, name="alertmanager", timeout=timeout
        )
        return self

    def stop(self, timeout: float = 10.0) -> None:
        served_binary.stop(self.proc, timeout)

    def log(self) -> str:
        return served_binary.log_tail(self.log_path)

    def post_alert(
        self,
        labels: dict[str, str],
        annotations: dict[str, str],
        starts_at: datetime,
        ends_at: datetime | None = None,
    ) -> None:
        """What Prometheus does: POST /api/v2/alerts. An `endsAt` in the past resolves it."""
        alert: dict[str, Any] = {
            "labels": labels,
            "annotations": annotations,
            "startsAt": rfc3339(starts_at),
            "generatorURL": "http://prometheus:9090/graph?g0.expr=up+%3D%3D+0",
        }
        if ends_at is not None:
            alert["endsAt"] = rfc3339(ends_at)
        reply = httpx.post(f"{self.url}/api/v2/alerts", json=[alert], timeout=10)
        assert reply.status_code == 200, reply.text


@contextmanager
def running_alertmanager(directory: Path, webhook_url: str) -> Iterator[Alertmanager]:
    manager = Alertmanager(require_binary(), directory, webhook_url)
    try:
        yield manager.start()
    finally:
        manager.stop()
