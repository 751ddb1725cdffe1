"""The Host check (surfaces/http_api.py, DNS rebinding): which names a request may carry."""

from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake import settings
from ntfy_intake.surfaces import http_api

NAMES = frozenset({"pi.lan", "intake.home.lan"})


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8788",
        "127.0.0.1",
        "[::1]:8788",
        "[::1]",
        "192.168.1.5:8788",  # an IP literal: the page came from this address itself
        "[fe80::1%25eth0]:8788",
        "localhost:8788",
        "LOCALHOST",
        "app.localhost:8788",  # RFC 6761: loopback, resolved so by browsers
        "pi.lan:8788",
        "pi.lan.:8788",  # the absolute form of the same name
        "intake.home.lan",
        "Intake.Home.Lan:443",
        None,  # HTTP/1.0 without Host: no browser sends it
    ],
)
def test_loopback_addresses_and_the_configured_names_pass(host: str | None) -> None:
    assert http_api.host_allowed(host, NAMES)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:8788",
        "evil.example",
        "127.0.0.1.evil.example:8788",  # a name that merely starts like an address
        "pi.lan.evil.example",
        "localhost.evil.example",
        "pi.lan:notaport",
        ":8788",
        "",
        "[::1",
        "[::1]x",
        "[::1]:x",
    ],
)
def test_any_other_name_is_refused(host: str) -> None:
    assert not http_api.host_allowed(host, NAMES)


def test_the_names_come_from_listen_public_url_and_cluster_url(tmp_path: Path) -> None:
    loaded = settings.load(
        None,
        {
            "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
            "NTFY_INTAKE_NTFY_TOPICS": "alerts",
            "NTFY_INTAKE_STATE_DIR": str(tmp_path),
            "NTFY_INTAKE_HTTP_LISTEN": "pi.lan:8788",
            "NTFY_INTAKE_HTTP_PUBLIC_URL": "https://Intake.Home.Lan/",
        },
    )
    assert http_api.trusted_hosts(loaded) == {"pi.lan", "intake.home.lan"}
