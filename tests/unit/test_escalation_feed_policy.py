"""Which escalation policy the settings ask for (DESIGN.md section 13): a relay's requests wait for
its 2xx; without a relay, only a named feed handle gives escalation something to wait for.

Each test is named after the failure it kills.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ntfy_intake import settings
from ntfy_intake.rules import escalation


def test_feed_alone_escalates_only_when_a_handle_is_named() -> None:
    """Failure modes: a feed-only install escalates every request (nobody could ack: the owner
    is told about every alert), or one with a named handle never escalates."""
    assert escalation.configured(600.0, 4, relay=False, feed_handle=None) is None
    feed = escalation.configured(600.0, 4, relay=False, feed_handle="triager")
    assert feed == escalation.Policy(600.0, 4, "triager")
    relay = escalation.configured(600.0, 4, relay=True, feed_handle=None)
    assert relay == escalation.Policy(600.0, 4, None)
    assert escalation.configured(0.0, 4, relay=False, feed_handle="triager") is None
    assert escalation.configured(0.0, 4, relay=True, feed_handle=None) is None


def env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {
        "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
        "NTFY_INTAKE_NTFY_TOPICS": "alerts",
        "NTFY_INTAKE_STATE_DIR": str(tmp_path),
        **{f"NTFY_INTAKE_{k.upper()}": v for k, v in more.items()},
    }


def test_escalate_handle_is_read_and_defaults_to_none(tmp_path: Path) -> None:
    assert settings.load(None, env(tmp_path)).relay.escalate_handle is None
    named = settings.load(None, env(tmp_path, relay_escalate_handle="triager"))
    assert named.relay.escalate_handle == "triager"


def test_escalate_handle_no_handle_can_have_stops_start_up_naming_the_key(tmp_path: Path) -> None:
    """A name the feed refuses could never ack: every entry would escalate."""
    with pytest.raises(settings.ConfigError, match=r"relay\.escalate_handle.*not a feed handle"):
        settings.load(None, env(tmp_path, relay_escalate_handle="no spaces"))


def test_escalate_handle_is_ignored_beside_a_relay(tmp_path: Path) -> None:
    """With a relay the feed is not the only consumer: the relay's 2xx is what is waited for."""
    both = settings.load(
        None, env(tmp_path, relay_url="http://127.0.0.1:9/t", relay_escalate_handle="triager")
    )
    relay = both.relay
    policy = escalation.configured(
        relay.escalate_after,
        relay.escalate_min_severity,
        relay=relay.url is not None,
        feed_handle=relay.escalate_handle,
    )
    assert policy is not None and policy.feed_handle is None
