"""Prometheus metrics: one custom collector that reads the daemon's snapshot at scrape time.

Nothing is registered in prometheus-client's global registry: `registry_for` builds a fresh
`CollectorRegistry` per HTTP app, so tests and several apps in one process never collide.

The snapshot is a flat mapping produced by the daemon (see `SNAPSHOT_KEYS`). Every key is
optional: a missing key or a ``None`` value means "no sample" (for example, no frame seen yet).
Values that are not numbers are skipped rather than failing the scrape. Example::

    {
        "intake_state": "live",            # "live" | "reconnecting" | "dead"
        "health_state": "live",            # health.STATES: adds "degraded" and "latched"
        "last_frame_age_s": 1.2,           # seconds, None before the first frame
        "connections_total": 3,
        "reconnects_total": 2,
        "watchdog_drops_total": 0,
        "events_recorded_total": 41,
        "duplicates_total": 5,
        "conflicts_total": 0,
        "quarantined_total": 1,
        "cursor_moves_total": 47,
        "audit_latch": False,              # bool (or 0/1)
        "relay_collecting": 2,             # in their debounce window, not yet released
        "relay_pending": 0,                # released, waiting for delivery
        "relay_dead": 0,
        "relay_delivered_total": 12,
        "relay_attempts_total": 14,
        "owner_pending": 0,
        "owner_sent_total": 3,
        "owner_suppressed_total": 1,
        "owner_receive_last_ok_age_s": 4.2,  # with owner.receive on; None before the first
        "owner_receive_failures_total": 0,
        "escalations_today": 1,            # with escalation on: let through on today's date
        "escalations_held_today": 0,       # held on that day (cap, silence, ack, maintenance)
        "feed_head": {"triage": 12},       # channel -> highest seq
        "leader": 1, "term": 4, "failovers_total": 1,  # with a standby (PostgreSQL)
        "ready": True, "cluster_intake_live": True,     # readiness (PostgreSQL)
    }

`snapshot()` is called on the scraping thread (the HTTP app calls it on its event loop), once per
scrape: keep it cheap and free of blocking I/O. If it raises, the scrape still succeeds with
``ntfy_intake_metrics_snapshot_ok 0`` and nothing else from this collector. What the store holds
(`escalation_counts`, like the queue counts) is read in the database thread when the daemon
refreshes its snapshot (runtime/vitals.py), never at scrape time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

import structlog
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from ntfy_intake.flow import escalator
from ntfy_intake.rules import escalation, health
from ntfy_intake.settings import Settings
from ntfy_intake.store import escalations
from ntfy_intake.store.transaction import Connection

__all__ = [
    "CONTENT_TYPE",
    "HEALTH_STATES",
    "INTAKE_STATES",
    "METRIC_NAMES",
    "PREFIX",
    "SNAPSHOT_KEYS",
    "Snapshot",
    "SnapshotCollector",
    "escalation_counts",
    "registry_for",
    "render",
    "snapshot_collector",
]

PREFIX: Final = "ntfy_intake_"
CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4
INTAKE_STATES: Final = tuple(str(state) for state in health.INTAKE_STATES)
HEALTH_STATES: Final = tuple(str(state) for state in health.STATES)

Snapshot = Callable[[], Mapping[str, Any]]

log = structlog.get_logger("ntfy_intake.metrics")

# (snapshot key, metric name without prefix, kind, help). Counter names end in _total on the wire.
_SCALARS: Final[tuple[tuple[str, str, str, str], ...]] = (
    (
        "last_frame_age_s",
        "last_frame_age_seconds",
        "gauge",
        "Seconds since the last frame (open, keepalive or message) from ntfy.",
    ),
    ("connections_total", "connections_total", "counter", "Subscription connections opened."),
    ("reconnects_total", "reconnects_total", "counter", "Reconnects after a lost subscription."),
    (
        "watchdog_drops_total",
        "watchdog_drops_total",
        "counter",
        "Connections dropped because no frame arrived within keepalive_timeout.",
    ),
    ("events_recorded_total", "events_recorded_total", "counter", "Alerts recorded in the inbox."),
    ("duplicates_total", "duplicates_total", "counter", "Repeated alerts absorbed as duplicates."),
    (
        "conflicts_total",
        "conflicts_total",
        "counter",
        "Alerts whose id was seen before with different content.",
    ),
    ("quarantined_total", "quarantined_total", "counter", "Frames quarantined as malformed."),
    ("cursor_moves_total", "cursor_moves_total", "counter", "Resume-cursor advances."),
    (
        "audit_latch",
        "audit_latch",
        "gauge",
        "1 when the audit log could not be written durably (restart advised).",
    ),
    (
        "relay_collecting",
        "relay_collecting",
        "gauge",
        "Triage requests in their debounce window (released when it closes).",
    ),
    (
        "relay_pending",
        "relay_pending",
        "gauge",
        "Triage requests released and waiting for delivery.",
    ),
    ("relay_dead", "relay_dead", "gauge", "Triage requests that gave up (see redrive)."),
    ("relay_delivered_total", "relay_delivered_total", "counter", "Triage requests delivered."),
    ("relay_attempts_total", "relay_attempts_total", "counter", "Relay delivery attempts."),
    ("owner_pending", "owner_pending", "gauge", "Owner messages waiting to be sent."),
    ("owner_sent_total", "owner_sent_total", "counter", "Owner messages sent."),
    (
        "owner_suppressed_total",
        "owner_suppressed_total",
        "counter",
        "Owner messages suppressed by cooldown or the daily cap.",
    ),
    # Replies from the owner's phone (absent while `owner.receive` is off).
    (
        "owner_receive_last_ok_age_s",
        "owner_receive_last_ok_age_seconds",
        "gauge",
        "Seconds since the last successful receive of the owner's replies (none before the first).",
    ),
    (
        "owner_receive_failures_total",
        "owner_receive_failures_total",
        "counter",
        "Receives of the owner's replies that failed (this run).",
    ),
    # Escalations when the agent is silent (absent while escalation is off): the day's in
    # `cadence.timezone`, from the overview `status` shows (surfaces/status.py).
    (
        "escalations_today",
        "escalations_today",
        "gauge",
        "Escalations let through today (cadence.timezone): what relay.escalate_daily_cap counts.",
    ),
    (
        "escalations_held_today",
        "escalations_held_today",
        "gauge",
        "Escalations held today: by relay.escalate_daily_cap, a silence, an ack or a maintenance"
        " window.",
    ),
    # The standby (PostgreSQL only; absent on one box).
    ("leader", "leader", "gauge", "1 while this node holds the lease and acts, 0 on a standby."),
    ("term", "term", "gauge", "The leadership term this node holds, or the one it last saw."),
    (
        "failovers_total",
        "failovers_total",
        "counter",
        "Terms this process took over from another holder.",
    ),
    # Readiness (DESIGN.md section 11), on every node of a cluster.
    (
        "ready",
        "ready",
        "gauge",
        "1 while this node's last probe found it could do the work (its own ntfy answers, its"
        " code knows the schema, its work equals the leader's); 0 otherwise.",
    ),
    (
        "cluster_intake_live",
        "cluster_intake_live",
        "gauge",
        "1 while the leader's intake, as the leader last stored it, is live; 0 otherwise (no"
        " leader, its intake dead or latched, or it stopped reporting). Same on every node.",
    ),
)

# Every snapshot key the collector reads.
SNAPSHOT_KEYS: Final = (
    "intake_state",
    "health_state",
    *(key for key, *_ in _SCALARS),
    "feed_head",
)

# Every metric family name as it appears on the wire (counters with their _total sample name).
METRIC_NAMES: Final = (
    f"{PREFIX}metrics_snapshot_ok",
    f"{PREFIX}intake_up",
    f"{PREFIX}intake_state",
    f"{PREFIX}healthy",
    f"{PREFIX}health_state",
    *(f"{PREFIX}{name}" for _, name, _, _ in _SCALARS),
    f"{PREFIX}feed_head",
)


def _number(value: object) -> float | None:
    """A finite sample value, or None when the value is absent or not a number."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        number = float(value)
        return number if not math.isnan(number) else None
    return None


class SnapshotCollector:
    """A prometheus-client collector over a snapshot callback (read once per scrape)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        try:
            data = dict(self._snapshot())
        except Exception as exc:  # noqa: BLE001 - a broken snapshot must not break the scrape
            log.warning("metrics.snapshot_failed", error_type=type(exc).__name__)
            yield GaugeMetricFamily(
                f"{PREFIX}metrics_snapshot_ok", "1 when the daemon snapshot was read.", value=0
            )
            return
        yield GaugeMetricFamily(
            f"{PREFIX}metrics_snapshot_ok", "1 when the daemon snapshot was read.", value=1
        )
        yield from _intake_state(data.get("intake_state"))
        yield from _health_state(data.get("health_state"))
        for key, name, kind, doc in _SCALARS:
            value = _number(data.get(key))
            if value is None:
                continue
            if kind == "counter":
                yield CounterMetricFamily(f"{PREFIX}{name}", doc, value=value)
            else:
                yield GaugeMetricFamily(f"{PREFIX}{name}", doc, value=value)
        heads = data.get("feed_head")
        if isinstance(heads, Mapping):
            family = GaugeMetricFamily(
                f"{PREFIX}feed_head", "Highest entry seq per feed channel.", labels=["channel"]
            )
            for channel, head in sorted(heads.items(), key=lambda item: str(item[0])):
                number = _number(head)
                if number is not None:
                    family.add_metric([str(channel)], number)
            yield family


def _intake_state(state: object) -> Iterator[Metric]:
    yield from _state_families(
        state,
        INTAKE_STATES,
        ("intake_up", "1 when the ntfy subscription is live."),
        ("intake_state", "Intake state: 1 for the current state, 0 for the others."),
    )


def _health_state(state: object) -> Iterator[Metric]:
    yield from _state_families(
        state,
        HEALTH_STATES,
        (
            "healthy",
            "1 when the overall health state is live (the same verdict as `ntfy-intake check`).",
        ),
        (
            "health_state",
            "Overall health (live, degraded, reconnecting, dead, latched): 1 for the current state.",
        ),
    )


def _state_families(
    state: object, known: Sequence[str], up: tuple[str, str], one_hot: tuple[str, str]
) -> Iterator[Metric]:
    """A 0/1 gauge that says "live", and a one-hot gauge over the known states (plus an unknown
    current one, so a new state name never disappears from the scrape)."""
    if not isinstance(state, str):
        return
    yield GaugeMetricFamily(f"{PREFIX}{up[0]}", up[1], value=1.0 if state == "live" else 0.0)
    family = GaugeMetricFamily(f"{PREFIX}{one_hot[0]}", one_hot[1], labels=["state"])
    for name in (*known, *(() if state in known else (state,))):
        family.add_metric([name], 1.0 if name == state else 0.0)
    yield family


def escalation_counts(conn: Connection, settings: Settings, now: float) -> dict[str, Any]:
    """The day's escalations for the snapshot (`escalations_today`, `escalations_held_today`),
    counted by the overview `status` shows (rules/escalation.overview, on what
    store/escalations.recorded reads); nothing while escalation is off. In the database
    thread."""
    policy = escalator.policy_for(settings.relay)
    if policy is None:
        return {}
    # Two days back covers today in any zone, whatever the offset (as `status`).
    recorded = escalations.recorded(conn, since=now - 2 * 86400)
    view = escalation.overview(policy, settings.cadence.timezone, recorded, (), now)
    return {"escalations_today": view.today, "escalations_held_today": view.held_today}


def snapshot_collector(snapshot: Snapshot) -> SnapshotCollector:
    """A collector that renders `snapshot()` (shape in the module docstring) at scrape time."""
    return SnapshotCollector(snapshot)


def registry_for(snapshot: Snapshot, *, process: bool = True) -> CollectorRegistry:
    """A fresh registry holding the snapshot collector (and the process collector, on Linux)."""
    registry = CollectorRegistry()
    registry.register(snapshot_collector(snapshot))
    if process:
        ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition (format 0.0.4, `CONTENT_TYPE`)."""
    return generate_latest(registry)
