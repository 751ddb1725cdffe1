"""Publisher profiles (DESIGN.md section 12): each publisher's exact ntfy payloads, firing and
resolved, as its public source builds them, and look-alikes no profile may claim.

Each row says where its payload comes from (repository, path, the commit read). The payloads
are written out here as those sources produce them; no code of theirs is copied.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ntfy_intake.errors import ConfigError
from ntfy_intake.rules import incidents, profiles
from ntfy_intake.rules.profiles import base
from ntfy_intake.settings import env_name, load
from ntfy_intake.wire.frames import Message, decode_line


class Payload(NamedTuple):
    title: str | None
    message: str
    priority: int | None
    tags: tuple[str, ...]


def frame(payload: Payload, *, topic: str = "alerts", n: int = 1) -> Message:
    """The message as a subscriber reads it back from ntfy."""
    obj: dict[str, object] = {
        "id": f"id{n:010d}",
        "time": 1_700_000_000 + n,
        "expires": 1_700_043_200 + n,
        "event": "message",
        "topic": topic,
        "message": payload.message,
    }
    if payload.title is not None:
        obj["title"] = payload.title
    if payload.priority is not None:
        obj["priority"] = payload.priority
    if payload.tags:
        obj["tags"] = list(payload.tags)
    decoded = decode_line(json.dumps(obj).encode(), frozenset({topic}))
    assert isinstance(decoded, Message)
    return decoded


# -------------------------------------------------------------------------------------------------
# The tables: (payload, profile, key, status, severity)

# louislam/uptime-kuma server/notification-providers/ntfy.js (commit 04d5e83e): title is the
# monitor name, " Down"/" Up", " [Uptime-Kuma]"; tags start with red_circle/green_circle, then the
# monitor's tags ("name" or "name: value"); Down goes at priority + 1 (default priority 4, so 5).
UPTIME_KUMA = [
    (
        Payload("web Down [Uptime-Kuma]", "Connection refused", 5, ("red_circle",)),
        ("uptime-kuma", "uptime-kuma:alerts:web", "firing", 5),
    ),
    (
        Payload("web Up [Uptime-Kuma]", "200 - OK", 4, ("green_circle",)),
        ("uptime-kuma", "uptime-kuma:alerts:web", "resolved", 4),
    ),
    (
        Payload(
            "Home  Assistant Down [Uptime-Kuma]",
            "timeout of 48000ms exceeded",
            5,
            ("red_circle", "lan", "env: prod"),
        ),
        ("uptime-kuma", "uptime-kuma:alerts:home assistant", "firing", 5),
    ),
    (
        # A monitor whose own name ends in a state word: the last word before the suffix counts.
        Payload("Is it Up Down [Uptime-Kuma]", "down", 5, ("red_circle", "green_circle")),
        ("uptime-kuma", "uptime-kuma:alerts:is it up", "firing", 5),
    ),
    (
        Payload("Is it Up Up [Uptime-Kuma]", "OK", 3, ("green_circle", "red_circle")),
        ("uptime-kuma", "uptime-kuma:alerts:is it up", "resolved", 3),
    ),
]

# TwiN/gatus alerting/provider/ntfy/ntfy.go (commit 08c46354, v5.36): title "Gatus: " + display
# name (group/name); exactly one tag, rotating_light when triggered, white_check_mark when
# resolved; the body's first sentence names which; the provider's priority (default 3). Gatus v4
# (commit 080563bd) sent the tag "x" when triggered.
GATUS = [
    (
        Payload(
            "Gatus: core/api",
            "An alert has been triggered due to having failed 3 time(s) in a row with the "
            "following description: api down\n🔴 [CONNECTED] == true\n🔴 [STATUS] == 200",
            3,
            ("rotating_light",),
        ),
        ("gatus", "gatus:alerts:core/api", "firing", 3),
    ),
    (
        Payload(
            "Gatus: core/api",
            "An alert has been resolved after passing successfully 5 time(s) in a row with the "
            "following description: api down\n🟢 [CONNECTED] == true\n🟢 [STATUS] == 200",
            3,
            ("white_check_mark",),
        ),
        ("gatus", "gatus:alerts:core/api", "resolved", 3),
    ),
    (
        Payload(
            "Gatus: nas",
            "An alert has been triggered due to having failed 2 time(s) in a row",
            4,
            ("x",),
        ),
        ("gatus", "gatus:alerts:nas", "firing", 4),
    ),
]

# healthchecks/healthchecks hc/integrations/ntfy/transport.py and templates/ntfy_title.html
# (commit 29b5ec25; hc/api/transports.py before): title "<name> is DOWN|UP", exactly one tag,
# red_circle for down, green_circle for up; priority and "priority up" are the channel's.
HEALTHCHECKS = [
    (
        Payload(
            "Nightly backup is DOWN",
            "Reason: success signal did not arrive on time, grace time passed.\n\n"
            "**Project:** Homelab\n**Period:** 1 day\n**Total Pings:** 112\n"
            "**Last Ping:** Success, 1 day ago",
            5,
            ("red_circle",),
        ),
        ("healthchecks", "healthchecks:alerts:nightly backup", "firing", 5),
    ),
    (
        Payload(
            "Nightly backup is UP",
            "The downtime lasted 1 hour, 30 minutes.\n\n**Total Pings:** 113",
            3,
            ("green_circle",),
        ),
        ("healthchecks", "healthchecks:alerts:nightly backup", "resolved", 3),
    ),
    (
        # An unnamed check is titled by its UUID (models.Check.name_then_code).
        Payload("0c3b1f0e-8a4e-4a43-9a3e-3c5b0d3f9a11 is DOWN", "", 3, ("red_circle",)),
        (
            "healthchecks",
            "healthchecks:alerts:0c3b1f0e-8a4e-4a43-9a3e-3c5b0d3f9a11",
            "firing",
            3,
        ),
    ),
]

# binwiederhier/ntfy server/templates/alertmanager.yml (commit ae62e0d9, ntfy >= 2.14): rendered
# from Alertmanager's webhook with ?template=alertmanager; no tags; priority from the URL.
_AM_BODY = (
    "Status: {status}\nReceiver: ntfy\nAlert: DiskFull\nInstance: nas:9100\n"
    "Severity: {severity}\nStarts at: 2026-12-06T10:00:00Z\nSummary: disk 91% full\n"
    "Source: http://prometheus:9090/graph\n"
)
ALERTMANAGER = [
    (
        Payload(
            "🚨 Alert: DiskFull", _AM_BODY.format(status="Firing", severity="critical"), None, ()
        ),
        ("alertmanager", "alertmanager:alerts:diskfull", "firing", 5),
    ),
    (
        Payload(
            "✅ Resolved: DiskFull",
            _AM_BODY.format(status="Resolved", severity="critical"),
            None,
            (),
        ),
        ("alertmanager", "alertmanager:alerts:diskfull", "resolved", 5),
    ),
    (
        Payload("🚨 Alert: DiskFull", _AM_BODY.format(status="Firing", severity="info"), 2, ()),
        ("alertmanager", "alertmanager:alerts:diskfull", "firing", 2),
    ),
]

# binwiederhier/ntfy server/templates/grafana.yml (commit ae62e0d9): "🚨 "/"✅ " + Grafana's
# title, whose default is grafana/alerting's `__subject` (templates/default_template.go, read as
# an indexed excerpt, no commit): "[FIRING:n] <group labels> (<common>)", "[RESOLVED] ...".
GRAFANA = [
    (
        Payload("🚨 [FIRING:1] HighCPU homelab (nas)", "Value: B=97", None, ()),
        ("grafana", "grafana:alerts:highcpu homelab (nas)", "firing", 3),
    ),
    (
        Payload("🚨 [FIRING:2, RESOLVED:1] HighCPU homelab (nas)", "Value: B=97", 4, ()),
        ("grafana", "grafana:alerts:highcpu homelab (nas)", "firing", 4),
    ),
    (
        Payload("✅ [RESOLVED] HighCPU homelab (nas)", "Value: B=12", None, ()),
        ("grafana", "grafana:alerts:highcpu homelab (nas)", "resolved", 3),
    ),
]

# alexbakker/alertmanager-ntfy internal/server/server.go (commit 015c4b44), util.go (15cb8cc1:
# labels as "name = value" tags) and README.md (0de5ad5e) / config.example.yml (01778d3c): title
# "Resolved: " + summary when resolved; tags rotating_light firing, +1 resolved; priority urgent
# firing, default resolved.
_LABELS = ("alertname = DiskFull", "instance = nas:9100", "severity = critical")
ALERTMANAGER_NTFY = [
    (
        Payload("Disk 91% full on nas", "ZFS pool tank", 5, ("rotating_light", *_LABELS)),
        (
            "alertmanager-ntfy",
            "alertmanager-ntfy:alerts:diskfull{instance=nas:9100,severity=critical}",
            "firing",
            5,
        ),
    ),
    (
        Payload("Resolved: Disk 12% full on nas", "ZFS pool tank", 3, ("+1", *_LABELS[::-1])),
        (
            "alertmanager-ntfy",
            "alertmanager-ntfy:alerts:diskfull{instance=nas:9100,severity=critical}",
            "resolved",
            3,
        ),
    ),
    (
        # No label tags: the resolve keys as the title rule keyed its firing.
        Payload("Resolved: Disk full on nas", "ZFS pool tank", 3, ("+1",)),
        ("alertmanager-ntfy", "alerts:disk full on nas", "resolved", 3),
    ),
]

TABLES = UPTIME_KUMA + GATUS + HEALTHCHECKS + ALERTMANAGER + GRAFANA + ALERTMANAGER_NTFY


@pytest.mark.parametrize(("payload", "expected"), TABLES)
def test_each_publishers_payload_maps_onto_the_envelopes_model(
    payload: Payload, expected: tuple[str, str, str, int]
) -> None:
    message = frame(payload)
    signal = incidents.signal_of(message)
    assert (signal.profile, signal.key, signal.status, signal.severity) == expected
    assert signal.envelope is False


# Firings no profile claims whose resolve a profile keys onto them (the bridge without labels).
UNCLAIMED_FIRINGS = [Payload("Disk full on nas", "ZFS pool tank", 5, ("rotating_light",))]


@pytest.mark.parametrize(
    "table", [UPTIME_KUMA, GATUS, HEALTHCHECKS, ALERTMANAGER, GRAFANA, ALERTMANAGER_NTFY]
)
def test_every_publishers_resolve_meets_its_firing(table: list[tuple[Payload, object]]) -> None:
    """The bug this kills: a recovery opened a second incident (Uptime Kuma) or joined its
    incident as still firing (Gatus, healthchecks). Keys as signal_of computes them."""
    signals = [incidents.signal_of(frame(payload)) for payload, _ in table]
    firing = {s.key for s in signals if s.status == "firing"}
    firing |= {incidents.signal_of(frame(p)).key for p in UNCLAIMED_FIRINGS}
    resolved = [s for s in signals if s.status == "resolved"]
    assert resolved
    assert all(s.key in firing for s in resolved), [s.key for s in resolved]


def test_uptime_kuma_down_then_up_is_one_incident_that_ends_resolved() -> None:
    down, up = frame(UPTIME_KUMA[0][0], n=1), frame(UPTIME_KUMA[1][0], n=2)
    state = incidents.merge(None, incidents.signal_of(down), down)
    up_signal = incidents.signal_of(up)
    assert up_signal.key == state.key
    state = incidents.merge(state, up_signal, up)
    assert (state.status, state.severity, state.events) == ("resolved", 5, 2)


def test_alertmanager_ntfy_titleless_resolve_meets_its_masked_firing() -> None:
    """With an empty description the bridge sends the summary as the body and no title: the
    firing keys by the masked first line, and so must its resolve."""
    firing = frame(Payload(None, "Disk 91% full on nas", 5, ("rotating_light",)), n=1)
    resolve = frame(Payload(None, "Resolved: Disk 12% full on nas", 3, ("+1",)), n=2)
    firing_signal, resolve_signal = incidents.signal_of(firing), incidents.signal_of(resolve)
    assert firing_signal.profile is None
    assert resolve_signal.key == firing_signal.key == "alerts:disk <pct> full on nas"
    assert (resolve_signal.profile, resolve_signal.status) == ("alertmanager-ntfy", "resolved")


@pytest.mark.parametrize(
    "title", ["  Disk \n FULL ", "x" * 300, "Resolved: a\tb", "ÄBC  déf", "a b c"]
)
def test_the_profiles_title_part_is_the_title_rules(title: str) -> None:
    assert base.title_part(title) == incidents.normalise_title(title)


# -------------------------------------------------------------------------------------------------
# Look-alikes: a person's typing, another publisher's shape, a half-right payload

LOOK_ALIKES = [
    # Uptime Kuma's title without its tag, or with the other state's tag, or a custom suffix
    Payload("web Down [Uptime-Kuma]", "typed by hand", 3, ()),
    Payload("web Down [Uptime-Kuma]", "x", 5, ("green_circle",)),
    Payload("web Up [Uptime-Kuma]", "x", 4, ("lan", "green_circle")),
    Payload("web down [Uptime-Kuma]", "x", 5, ("red_circle",)),
    Payload("web Down [Uptime Kuma]", "x", 5, ("red_circle",)),
    Payload("backup [Uptime-Kuma]", "certificate expires", 4, ("test_tube",)),
    Payload("Down [Uptime-Kuma]", "x", 5, ("red_circle",)),
    # Gatus's title with unrelated tags or body
    Payload("Gatus: core/api", "deploy finished", 3, ("white_check_mark",)),
    Payload("Gatus: core/api", "An alert has been triggered due to having failed 3 time(s)", 3, ()),
    Payload(
        "Gatus: core/api",
        "An alert has been resolved after passing successfully 5 time(s) in a row",
        3,
        ("rotating_light",),
    ),
    Payload(
        "Gatus: api",
        "An alert has been triggered due to having failed 3 time(s) in a row",
        3,
        ("rotating_light", "extra"),
    ),
    # healthchecks' shape without its single matching tag
    Payload("nas is DOWN", "typed", 3, ()),
    Payload("nas is UP", "x", 3, ("red_circle",)),
    Payload("nas is down", "x", 3, ("red_circle",)),
    Payload("nas is DOWN", "x", 3, ("red_circle", "warning")),
    # ntfy's alertmanager template title without its body, or with tags
    Payload("🚨 Alert: DiskFull", "someone copied the title", 3, ()),
    Payload("✅ Resolved: DiskFull", _AM_BODY.format(status="Firing", severity="x"), 3, ()),
    Payload("🚨 Alert: DiskFull", _AM_BODY.format(status="Firing", severity="x"), 3, ("x",)),
    # Grafana without its status bracket, or its "no title" fallback
    Payload("🚨 Alert firing", "x", 3, ()),
    Payload("✅ HighCPU", "x", 3, ()),
    Payload("[RESOLVED] HighCPU", "x", 3, ()),
    # "Resolved: " typed by a person, with no resolve tag and no label tags
    Payload("Resolved: disk full", "fixed it", 3, ()),
    Payload("Resolved: disk full", "fixed it", 3, ("warning",)),
    Payload(None, "Resolved: disk full", 3, ()),
    # An "alertname=" tag not in the bridge's "name = value" form
    Payload("disk", "x", 3, ("alertname=DiskFull",)),
]


@pytest.mark.parametrize("payload", LOOK_ALIKES)
def test_a_look_alike_is_left_to_the_title_rule(payload: Payload) -> None:
    message = frame(payload)
    assert profiles.match("alerts", payload.title, payload.message, 3, payload.tags) is None
    assert incidents.signal_of(message) == incidents.signal_of(message, profiles=False)
    assert incidents.signal_of(message).profile is None


def test_an_envelope_wins_over_a_profile() -> None:
    body = json.dumps({"incident": "web", "severity": 2, "status": "firing"})
    signal = incidents.signal_of(frame(Payload("web Up [Uptime-Kuma]", body, 4, ("green_circle",))))
    assert (signal.key, signal.status, signal.severity, signal.envelope, signal.profile) == (
        "web",
        "firing",
        2,
        True,
        None,
    )


@pytest.mark.parametrize(("payload", "expected"), TABLES)
def test_profiles_off_is_the_title_rule_exactly(
    payload: Payload, expected: tuple[str, str, str, int]
) -> None:
    message = frame(payload)
    off = incidents.signal_of(message, profiles=False)
    assert off.profile is None and off.status == "firing"
    title_key = f"alerts:{incidents.normalise_title(payload.title or '')}"
    assert off.key == title_key


@pytest.mark.parametrize(("payload", "expected"), TABLES)
def test_exactly_one_profile_claims_each_payload(
    payload: Payload, expected: tuple[str, str, str, int]
) -> None:
    """The shapes do not overlap, so the order `match` asks them in decides nothing."""
    claims = [
        name
        for name, profile in profiles.PROFILES
        if profile("alerts", payload.title, payload.message, payload.priority or 3, payload.tags)
        is not None
    ]
    assert claims == [expected[0]]


_TEXT = st.text(st.characters(codec="utf-8"), max_size=60)
_SHAPED = st.sampled_from(
    [
        "{} Down [Uptime-Kuma]",
        "{} Up [Uptime-Kuma]",
        "Gatus: {}",
        "{} is DOWN",
        "🚨 Alert: {}",
        "✅ [RESOLVED] {}",
        "Resolved: {}",
    ]
)
_TAGS = st.lists(
    st.sampled_from(["red_circle", "green_circle", "rotating_light", "x", "white_check_mark", "+1"])
    | st.builds("{} = {}".format, st.sampled_from(["alertname", "job"]), _TEXT)
    | _TEXT,
    max_size=4,
)


@given(
    title=st.none() | _TEXT | st.builds(str.format, _SHAPED, _TEXT),
    message=_TEXT,
    priority=st.integers(1, 5),
    tags=_TAGS,
)
def test_any_message_gets_a_bounded_key_or_none_never_an_error(
    title: str | None, message: str, priority: int, tags: list[str]
) -> None:
    found = profiles.match(
        "alerts", title, message, priority, tuple(tags), first_line=incidents.normalise_first_line
    )
    if found is not None:
        assert found.profile in profiles.NAMES
        assert found.status in ("firing", "resolved")
        assert 1 <= found.severity <= 5
        assert 0 < len(found.key) <= base.KEY_LIMIT + len("alerts:")


def test_every_profile_is_in_a_table() -> None:
    assert {row[1][0] for row in TABLES} == set(profiles.NAMES)


# -------------------------------------------------------------------------------------------------
# The setting


BASE = {env_name("ntfy", "url"): "http://127.0.0.1:1", env_name("ntfy", "topics"): "alerts"}


@pytest.mark.parametrize(("value", "expected"), [(None, "auto"), ("auto", "auto"), ("off", "off")])
def test_the_profiles_setting(value: str | None, expected: str) -> None:
    environ = dict(BASE)
    if value is not None:
        environ[env_name("ntfy", "profiles")] = value
    assert load(None, environ).ntfy.profiles == expected


@pytest.mark.parametrize("value", ["on", "AUTO", "none", "uptime-kuma"])
def test_an_unknown_profiles_setting_is_refused_by_name(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(None, {**BASE, env_name("ntfy", "profiles"): value})
    assert "ntfy.profiles" in str(caught.value) or "NTFY_INTAKE_NTFY_PROFILES" in str(caught.value)
    assert '"auto" or "off"' in str(caught.value)
