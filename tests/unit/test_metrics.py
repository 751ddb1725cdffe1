"""The snapshot collector: exposition names, types and the handling of partial or broken snapshots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ntfy_intake.surfaces import metrics

FULL: dict[str, Any] = {
    "intake_state": "live",
    "health_state": "live",
    "last_frame_age_s": 1.5,
    "connections_total": 3,
    "reconnects_total": 2,
    "watchdog_drops_total": 1,
    "events_recorded_total": 41,
    "duplicates_total": 5,
    "conflicts_total": 0,
    "quarantined_total": 1,
    "cursor_moves_total": 47,
    "audit_latch": False,
    "relay_collecting": 5,
    "relay_pending": 2,
    "relay_dead": 1,
    "relay_delivered_total": 12,
    "relay_attempts_total": 14,
    "owner_pending": 0,
    "owner_sent_total": 3,
    "owner_suppressed_total": 1,
    "feed_head": {"triage": 12, "reviews": 4},
    "leader": 1,
    "term": 4,
    "failovers_total": 2,
    "ready": True,
    "cluster_intake_live": False,
    "owner_receive_last_ok_age_s": 4.2,
    "owner_receive_failures_total": 1,
    "escalations_today": 2,
    "escalations_held_today": 1,
}


def scrape(
    snapshot: Mapping[str, Any] | Exception,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    def read() -> Mapping[str, Any]:
        if isinstance(snapshot, Exception):
            raise snapshot
        return snapshot

    registry = CollectorRegistry()
    registry.register(metrics.snapshot_collector(read))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def types_of(snapshot: Mapping[str, Any]) -> dict[str, str]:
    registry = CollectorRegistry()
    registry.register(metrics.snapshot_collector(lambda: snapshot))
    text = generate_latest(registry).decode()
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def test_full_snapshot_exposes_every_documented_name_with_its_value() -> None:
    samples = scrape(FULL)
    names = {name for name, _ in samples}
    assert names == set(metrics.METRIC_NAMES)
    assert samples["ntfy_intake_intake_up", ()] == 1
    assert samples["ntfy_intake_last_frame_age_seconds", ()] == 1.5
    assert samples["ntfy_intake_connections_total", ()] == 3
    assert samples["ntfy_intake_events_recorded_total", ()] == 41
    assert samples["ntfy_intake_audit_latch", ()] == 0
    assert samples["ntfy_intake_relay_dead", ()] == 1
    assert samples["ntfy_intake_feed_head", (("channel", "triage"),)] == 12
    assert samples["ntfy_intake_feed_head", (("channel", "reviews"),)] == 4
    assert samples["ntfy_intake_metrics_snapshot_ok", ()] == 1
    assert samples["ntfy_intake_leader", ()] == 1
    assert samples["ntfy_intake_term", ()] == 4
    assert samples["ntfy_intake_failovers_total", ()] == 2


def test_counters_are_counters_and_levels_are_gauges() -> None:
    types = types_of(FULL)
    assert types["ntfy_intake_connections"] == "counter"  # the parser strips _total from families
    assert types["ntfy_intake_relay_delivered"] == "counter"
    assert types["ntfy_intake_relay_pending"] == "gauge"
    assert types["ntfy_intake_last_frame_age_seconds"] == "gauge"
    assert types["ntfy_intake_audit_latch"] == "gauge"


@pytest.mark.parametrize("state", ["live", "reconnecting", "dead"])
def test_intake_state_is_one_hot_and_up_only_when_live(state: str) -> None:
    samples = scrape({"intake_state": state})
    for name in metrics.INTAKE_STATES:
        assert samples["ntfy_intake_intake_state", (("state", name),)] == (name == state)
    assert samples["ntfy_intake_intake_up", ()] == (state == "live")


@pytest.mark.parametrize("state", ["live", "degraded", "reconnecting", "dead", "latched"])
def test_health_state_is_one_hot_over_the_five_names_and_healthy_only_when_live(
    state: str,
) -> None:
    samples = scrape({"health_state": state, "intake_state": "live"})
    for name in metrics.HEALTH_STATES:
        assert samples["ntfy_intake_health_state", (("state", name),)] == (name == state)
    assert samples["ntfy_intake_healthy", ()] == (state == "live")


def test_requests_in_their_debounce_window_are_shown_apart_from_pending() -> None:
    samples = scrape({"relay_collecting": 5, "relay_pending": 0})
    assert samples["ntfy_intake_relay_collecting", ()] == 5
    assert samples["ntfy_intake_relay_pending", ()] == 0


def test_latch_set_reads_one() -> None:
    assert scrape({"audit_latch": True})["ntfy_intake_audit_latch", ()] == 1


def test_missing_none_and_non_numeric_values_are_omitted_not_fatal() -> None:
    samples = scrape({"last_frame_age_s": None, "relay_pending": "lots", "owner_pending": 2})
    names = {name for name, _ in samples}
    assert "ntfy_intake_last_frame_age_seconds" not in names
    assert "ntfy_intake_relay_pending" not in names
    assert "ntfy_intake_intake_up" not in names
    assert samples["ntfy_intake_owner_pending", ()] == 2


def test_a_failing_snapshot_still_scrapes_with_snapshot_ok_zero() -> None:
    samples = scrape(RuntimeError("boom"))
    assert samples == {("ntfy_intake_metrics_snapshot_ok", ()): 0}


def test_snapshot_is_read_at_scrape_time_not_at_registration() -> None:
    calls: list[int] = []
    value = {"connections_total": 1}

    def read() -> Mapping[str, Any]:
        calls.append(1)
        return value

    registry = metrics.registry_for(read, process=False)
    assert calls == []
    value["connections_total"] = 7
    assert b"ntfy_intake_connections_total 7.0" in metrics.render(registry)
    assert len(calls) == 1


def test_registry_for_never_touches_the_global_registry() -> None:
    before = set(REGISTRY._names_to_collectors)
    metrics.registry_for(lambda: FULL)
    metrics.registry_for(lambda: FULL)  # twice: no DuplicateTimeseries, no global state
    assert set(REGISTRY._names_to_collectors) == before
    assert not any(name.startswith("ntfy_intake_") for name in before)


def test_every_snapshot_key_is_documented_in_the_module() -> None:
    doc = metrics.__doc__ or ""
    for key in metrics.SNAPSHOT_KEYS:
        assert f'"{key}"' in doc, key
