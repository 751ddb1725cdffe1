"""Readiness per node and the work fingerprint (DESIGN.md section 11), the pure rules: what goes
into a digest (never a secret), which keys differ, which peers count as ready, and the one
verdict status, check, /healthz and /metrics read. Plus the [cluster] keys that time them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ntfy_intake.errors import ConfigError
from ntfy_intake.rules import readiness
from ntfy_intake.rules.readiness import NodeSeen
from ntfy_intake.settings import ConfigErrors, env_name, load
from ntfy_intake.surfaces import metrics

POLICY = {"debounce": "60", "cooldown": "3600", "daily_cap": "20", "timezone": "UTC"}
WORK: dict[str, Any] = {
    "ntfy_url": "https://ntfy.example.lan",
    "topics": ["alerts", "backups"],
    "relay_url": "http://127.0.0.1:9000/triage",
    "recipients": ["+31600000001"],
    "fallback_topic": "owner",
    "policy": POLICY,
}
PROBE = 10.0


def parts(**changed: Any) -> dict[str, str]:
    return readiness.fingerprint_parts(**{**WORK, **changed})


# -- the fingerprint -------------------------------------------------------------------------------


SECRETS = ("S3cr3t-pass", "tk_AbCdEf123456", "hunter2")


@pytest.mark.parametrize(
    ("key", "url", "clean"),
    [
        ("ntfy_url", "https://intake:S3cr3t-pass@ntfy.example.lan/", "https://ntfy.example.lan"),
        ("ntfy_url", "https://ntfy.example.lan/?auth=tk_AbCdEf123456", "https://ntfy.example.lan"),
        (
            "relay_url",
            "http://agent:hunter2@127.0.0.1:9000/triage?token=tk_AbCdEf123456#x",
            "http://127.0.0.1:9000/triage",
        ),
    ],
)
def test_no_digest_input_ever_holds_a_url_credential(key: str, url: str, clean: str) -> None:
    inputs = readiness.fingerprint_inputs(**{**WORK, key: url})
    text = "\n".join(inputs.values())
    for secret in SECRETS:
        assert secret not in text, inputs
    assert "@" not in text and "?" not in text and "#" not in text, inputs
    # ...and a credential changes nothing: two nodes with different passwords do one work.
    assert readiness.fingerprint_parts(**{**WORK, key: url}) == parts(**{key: clean})


def test_a_url_is_named_by_scheme_host_port_and_path_only() -> None:
    assert readiness.work_address("HTTPS://User:pw@NTFY.example.lan/base/?x=1") == (
        "https://ntfy.example.lan:443/base"
    )
    assert readiness.work_address("http://[::1]:8080/") == "http://[::1]:8080"
    assert readiness.work_address(None) == ""


def test_the_same_work_written_differently_has_one_fingerprint() -> None:
    same = parts(
        ntfy_url="https://ntfy.example.lan:443/",
        topics=["backups", "alerts"],
        recipients=["+31600000001"],
    )
    assert same == parts()
    assert readiness.fingerprint(same) == readiness.fingerprint(parts())


@pytest.mark.parametrize(
    ("changed", "key"),
    [
        ({"ntfy_url": "https://other.example.lan"}, "ntfy.url"),
        ({"ntfy_url": "https://ntfy.example.lan:8443"}, "ntfy.url"),
        ({"topics": ["alerts"]}, "ntfy.topics"),
        ({"profiles": "off"}, "ntfy.profiles"),
        ({"relay_url": None}, "relay.url"),
        ({"recipients": ["+31600000002"]}, "owner.recipients"),
        ({"fallback_topic": None}, "owner.fallback_topic"),
        ({"policy": {**POLICY, "daily_cap": "5"}}, "cadence"),
    ],
)
def test_each_work_key_that_differs_is_named_and_only_it(changed: dict[str, Any], key: str) -> None:
    theirs = parts(**changed)
    assert readiness.differing(parts(), theirs) == [key]
    assert readiness.fingerprint(theirs) != readiness.fingerprint(parts())


def test_differing_names_keys_in_a_fixed_order_and_a_missing_key_differs() -> None:
    theirs = parts(topics=["alerts"], ntfy_url="https://b.lan", policy={})
    assert readiness.differing(parts(), theirs) == ["ntfy.url", "ntfy.topics", "cadence"]
    assert readiness.differing(parts(), {}) == list(readiness.WORK_KEYS)
    assert readiness.differing(parts(), parts()) == []


def test_a_digest_shows_no_value_of_the_work() -> None:
    for key, digest in parts().items():
        assert len(digest) == readiness.DIGEST_CHARS and int(digest, 16) >= 0, key
        assert "alerts" not in digest and "ntfy" not in digest


# -- ready peers -----------------------------------------------------------------------------------


def row(node: str, **changed: Any) -> NodeSeen:
    base = NodeSeen(
        node=node,
        instance=f"{node}.1",
        ready=True,
        reason=None,
        fingerprint="f1",
        parts={},
        version="0.1.0",
        schema_known=True,
        seen_age_s=1.0,
        intake="standby",
        intake_age_s=None,
    )
    return replace(base, **changed)


@pytest.mark.parametrize(
    ("peer", "counts"),
    [
        (row("nas"), True),
        (row("nas", ready=False, reason="ntfy unreachable"), False),
        (row("nas", fingerprint="f2"), False),
        (row("nas", schema_known=False), False),
        (row("nas", seen_age_s=2 * PROBE), True),
        (row("nas", seen_age_s=readiness.fresh_within(PROBE)), True),
        (row("nas", seen_age_s=readiness.fresh_within(PROBE) + 0.01), False),
        (row("pi"), False),  # itself
    ],
)
def test_a_peer_is_ready_only_fresh_with_the_same_work_and_a_known_schema(
    peer: NodeSeen, counts: bool
) -> None:
    found = readiness.ready_peers([peer], me="pi", fingerprint="f1", probe_every=PROBE)
    assert found == ([peer] if counts else [])


def test_fresh_within_is_two_probes_plus_one_probes_budget() -> None:
    assert readiness.fresh_within(10.0) == 25.0
    assert readiness.fresh_within(1.0) == 2.5


def test_rows_age_by_the_reader_s_elapsed_time() -> None:
    (aged,) = readiness.aged([row("nas", intake_age_s=5.0)], 3.0)
    assert (aged.seen_age_s, aged.intake_age_s) == (4.0, 8.0)


# -- the one verdict -------------------------------------------------------------------------------


def judge(rows: list[NodeSeen], me: str = "nas", leader: str | None = "pi") -> readiness.Verdict:
    held = None if leader is None else (leader, f"{leader}.1")
    return readiness.judge(rows, me=me, leader=held, probe_every=PROBE, yield_after=60.0)


def test_a_ready_standby_behind_a_live_leader_is_healthy() -> None:
    verdict = judge([row("pi", intake="live", intake_age_s=600.0), row("nas")])
    assert (verdict.ready, verdict.intake_live, verdict.problems) == (True, True, ())


def test_a_standby_that_cannot_reach_ntfy_is_unhealthy_naming_why() -> None:
    reason = "ntfy unreachable from this node (http://127.0.0.1:9:80: ConnectError)"
    verdict = judge([row("pi", intake="live"), row("nas", ready=False, reason=reason)])
    assert not verdict.ready
    assert verdict.problems == (f"not ready: {reason}",)


def test_a_standby_whose_row_went_stale_is_not_ready() -> None:
    verdict = judge([row("pi", intake="live"), row("nas", seen_age_s=100.0)])
    assert not verdict.ready and "last reported" in (verdict.reason or "")
    assert not judge([row("pi", intake="live")]).ready  # never reported


@pytest.mark.parametrize("intake", ["dead", "latched"])
def test_a_leader_stalled_past_yield_after_with_nobody_ready_makes_every_standby_unhealthy(
    intake: str,
) -> None:
    stalled = row("pi", intake=intake, intake_age_s=61.0)
    # nas itself cannot reach ntfy either: nobody could take over.
    verdict = judge([stalled, row("nas", ready=False, reason="ntfy unreachable")])
    assert not verdict.intake_live
    assert any(f"intake {intake} for 61 s" in p for p in verdict.problems), verdict.problems
    # A ready node other than the leader: the leader yields to it, the standby is well.
    assert judge([stalled, row("nas")]).problems == ()
    # Not yet past yield_after: nothing to say but that the intake is not live.
    young = judge([replace(stalled, intake_age_s=59.0), row("nas", ready=False, reason="x")])
    assert young.problems == ("not ready: x",)


def test_intake_live_needs_the_lease_holder_s_own_fresh_row() -> None:
    assert not judge([row("pi", intake="live")], leader=None).intake_live
    assert not judge([row("pi", intake="live", instance="pi.0")]).intake_live  # another instance
    assert not judge([row("pi", intake="live", seen_age_s=100.0)]).intake_live  # stale
    assert judge([row("pi", intake="live")], me="pi").intake_live


# -- the metrics -----------------------------------------------------------------------------------


def scrape(snapshot: Mapping[str, Any]) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(metrics.snapshot_collector(lambda: snapshot))
    text = generate_latest(registry).decode()
    return {
        s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
    }


def test_ready_and_cluster_intake_live_are_scraped_as_one_or_zero() -> None:
    samples = scrape({"ready": False, "cluster_intake_live": True})
    assert samples["ntfy_intake_ready"] == 0
    assert samples["ntfy_intake_cluster_intake_live"] == 1
    assert "ntfy_intake_ready" not in scrape({"ready": None})  # one box: no sample


# -- the [cluster] keys ----------------------------------------------------------------------------

PG = {
    "NTFY_INTAKE_NTFY_URL": "https://ntfy.example.com",
    "NTFY_INTAKE_NTFY_TOPICS": "alerts",
    "NTFY_INTAKE_STATE_DATABASE": "postgresql://intake@db.lan/intake",
    "NTFY_INTAKE_CLUSTER_NODE": "pi",
}


def cluster(**keys: str) -> dict[str, str]:
    return PG | {env_name("cluster", key): value for key, value in keys.items()}


def test_the_readiness_keys_default_to_10s_1m_5m() -> None:
    c = load(None, PG).cluster
    assert (c.probe_every, c.yield_after, c.yield_cooloff) == (10.0, 60.0, 300.0)
    c = load(None, cluster(probe_every="2s", yield_after="30s", yield_cooloff="0s")).cluster
    assert (c.probe_every, c.yield_after, c.yield_cooloff) == (2.0, 30.0, 0.0)


def test_every_bad_readiness_key_is_reported_at_once() -> None:
    with pytest.raises(ConfigErrors) as caught:
        load(None, cluster(probe_every="0s", yield_after="-1s", yield_cooloff="soon"))
    text = str(caught.value)
    for key in ("cluster.probe_every", "cluster.yield_after", "cluster.yield_cooloff"):
        assert key in text, text


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"yield_after": "15s"}, "cluster.yield_after"),
        ({"probe_every": "21s"}, "cluster.probe_every"),
        ({"yield_after": "29s"}, "cluster.yield_after"),
    ],
)
def test_yield_after_under_three_probes_is_refused_on_the_key_given(
    keys: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(None, cluster(**keys))
    assert named in str(caught.value) and "3 x probe_every" in str(caught.value)
