"""Readiness per node and the work fingerprint (DESIGN.md section 11): plain values, no I/O.

Every node, leader or standby, probes on its own whether it could do the work and stores the
verdict in its row (store/nodes.py); these are the rules that read those rows.

- The **work fingerprint** says which work a node would do: where it subscribes (ntfy url as
  scheme/host/port/path, the sorted topics), where it relays (relay url without userinfo, query
  or fragment), whom it tells (sorted recipients, fallback topic) and how often (the cadence
  policy). Two nodes with different fingerprints are two different jobs: one must never take
  over the other's cursor. Each key is digested apart (`fingerprint_parts`), so a mismatch can
  be named by KEY without ever showing a value, and no secret is ever an input: credentials
  live in userinfo and the query (ntfy's `?auth=`), and those are cut before the digest
  (`fingerprint_inputs` is what goes in, for the tests that hold this).
- **A ready peer** (`ready_peers`) is another node whose row says ready, with this node's
  fingerprint, a schema its code knows, seen within the last two probes on the server's clock.

Invariants owned here:
- no input of a digest holds userinfo, a query or a fragment of a URL;
- the digests are stable across processes and versions of Python (sha256 of a canonical text).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

# The work keys, in the order a mismatch is named.
WORK_KEYS = (
    "ntfy.url",
    "ntfy.topics",
    "ntfy.profiles",
    "relay.url",
    "owner.recipients",
    "owner.fallback_topic",
    "cadence",
)
DIGEST_CHARS = 16  # 64 bits: two different works colliding by chance is not a failure mode
INTAKE_STATES = ("live", "dead", "latched", "standby")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def work_address(url: str | None) -> str:
    """A URL as the place the work goes: scheme://host:port/path, lowercased scheme and host,
    the scheme's default port spelled out, no trailing slash. Userinfo, query and fragment are
    cut: they carry credentials (ntfy's `?auth=`, `user:pass@`) and never say WHERE."""
    if not url:
        return ""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    port = port if port is not None else _DEFAULT_PORTS.get(scheme)
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal keeps its brackets next to the port
    where = f"{host}:{port}" if port is not None else host
    return f"{scheme}://{where}{parts.path.rstrip('/')}"


def fingerprint_inputs(
    *,
    ntfy_url: str,
    topics: Sequence[str],
    relay_url: str | None,
    recipients: Sequence[str],
    fallback_topic: str | None,
    policy: Mapping[str, str],
    profiles: str = "auto",
) -> dict[str, str]:
    """The canonical text each work key's digest is taken of (module doc: never a secret)."""
    return {
        "ntfy.url": work_address(ntfy_url),
        "ntfy.topics": ",".join(sorted(set(topics))),
        # The publisher profiles key a message: a standby with them off behind a leader with
        # them on would open a second incident for the same alert after a failover.
        "ntfy.profiles": profiles,
        "relay.url": work_address(relay_url),
        "owner.recipients": ",".join(sorted(set(recipients))),
        "owner.fallback_topic": fallback_topic or "",
        "cadence": ";".join(f"{k}={policy[k]}" for k in sorted(policy)),
    }


def fingerprint_parts(
    *,
    ntfy_url: str,
    topics: Sequence[str],
    relay_url: str | None,
    recipients: Sequence[str],
    fallback_topic: str | None,
    policy: Mapping[str, str],
    profiles: str = "auto",
) -> dict[str, str]:
    """One short digest per work key (WORK_KEYS), of `fingerprint_inputs`."""
    inputs = fingerprint_inputs(
        ntfy_url=ntfy_url,
        topics=topics,
        relay_url=relay_url,
        recipients=recipients,
        fallback_topic=fallback_topic,
        policy=policy,
        profiles=profiles,
    )
    return {key: _digest(f"{key}\n{text}") for key, text in inputs.items()}


def fingerprint(parts: Mapping[str, str]) -> str:
    """The whole work's digest: of every key's digest, in key order."""
    return _digest("\n".join(f"{key}={parts[key]}" for key in sorted(parts)))


def differing(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """The work keys whose digests differ (a key one side lacks differs), in WORK_KEYS order
    and then by name: what a start-up refusal names, never the values."""
    keys = set(mine) | set(theirs)
    order = {key: i for i, key in enumerate(WORK_KEYS)}
    return sorted(
        (k for k in keys if mine.get(k) != theirs.get(k)),
        key=lambda k: (order.get(k, len(order)), k),
    )


@dataclass(frozen=True)
class NodeSeen:
    """One node's row as the server saw it (store/nodes.read_all): ages on the server's clock."""

    node: str
    instance: str
    ready: bool
    reason: str | None
    fingerprint: str
    parts: Mapping[str, str]
    version: str
    schema_known: bool
    seen_age_s: float  # now() - seen_at, on the server
    intake: str  # "live" | "dead" | "latched" | "standby": that node's work, as it stored it
    intake_age_s: float | None  # how long that intake state has held (server clock)
    seen_at: float = 0.0  # the server's instant of the report (epoch s; compared with others only)


@dataclass(frozen=True)
class WorkState:
    """What a node reports of its own work at each probe: a leader its intake (live, dead,
    latched), a standby "standby". `since` is the monotonic instant this state began here."""

    intake: str = "standby"
    since: float | None = None


LATCHED = "the audit log could not be written (latched until this process restarts)"


def latch_reason(work: WorkState, *, last_term_latched: bool) -> str | None:
    """Why this node could not do the work because of its audit log, or None.

    A latched daemon cannot write the audit log it owes, and a latch lasts until the daemon
    restarts: so a leader latched now is not ready, and neither is a standby whose last term
    in this process ended latched (a yield for the latch, a lost lease, a stop): before this,
    such a yielder said ready again once the other node held the lease, and counted as the
    ready peer that a node in its cool-off held off for and another leader yielded to. A new
    term runs a new daemon, which tries the audit log afresh: its own state decides then.

    The reason is soft (runtime/readiness `hold_off`): a latched leader still records and
    relays every event (only its audit lines and the cursor's advance wait), so with no other
    node ready it still leads: nothing better exists (DESIGN.md section 11)."""
    if work.intake == "latched" or (work.intake == "standby" and last_term_latched):
        return LATCHED
    return None


def fresh_within(probe_every: float) -> float:
    """How old a row may be and still count as seen within the last two probes.

    A node reports at the END of each probe, and probes start every `probe_every`; a probe takes
    at most PROBE_BUDGET of a period (its ntfy request is bounded by that), so two reports are
    at most `probe_every * (1 + PROBE_BUDGET)` apart. Two probes' worth: 2 periods plus one
    probe's budget; a row older than that missed two reports in a row."""
    return probe_every * (2 + PROBE_BUDGET)


PROBE_BUDGET = 0.5  # of probe_every: the bound on one probe's ntfy request and writes


def ready_peers(
    rows: Sequence[NodeSeen], *, me: str, fingerprint: str, probe_every: float
) -> list[NodeSeen]:
    """The OTHER nodes that could take the work over now (module doc), freshest first."""
    limit = fresh_within(probe_every)
    peers = [
        row
        for row in rows
        if row.node != me
        and row.ready
        and row.fingerprint == fingerprint
        and row.schema_known
        and row.seen_age_s <= limit
    ]
    return sorted(peers, key=lambda row: (row.seen_age_s, row.node))


def says_not_ready(rows: Sequence[NodeSeen], node: str, *, probe_every: float) -> bool:
    """Whether `node`'s row, seen within the last two probes, says it cannot take the work: a
    fresh refusal, unlike a row gone stale (which may only be a late probe on a busy box)."""
    limit = fresh_within(probe_every)
    return any(row.node == node and not row.ready and row.seen_age_s <= limit for row in rows)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]


def aged(rows: Sequence[NodeSeen], seconds: float) -> list[NodeSeen]:
    """The rows as they would read `seconds` after they were read (a duration on the reader's
    clock added to the server's ages: a duration may cross clocks, an instant never does)."""
    if seconds <= 0:
        return list(rows)
    return [
        replace(
            row,
            seen_age_s=row.seen_age_s + seconds,
            intake_age_s=None if row.intake_age_s is None else row.intake_age_s + seconds,
        )
        for row in rows
    ]


@dataclass(frozen=True)
class Verdict:
    """What the rows say about one node and the cluster's work: the one model `status`,
    `check`, `/healthz`, `/metrics` and the console read (DESIGN.md section 11)."""

    ready: bool
    reason: str | None  # why this node is not ready (None when it is)
    leader: NodeSeen | None  # the lease holder's row (same instance), when the lease is fresh
    intake_live: bool  # the leader's intake as it stored it, in a fresh row
    problems: tuple[str, ...]  # what makes a standby unhealthy (empty: nothing)


def judge(
    rows: Sequence[NodeSeen],
    *,
    me: str,
    leader: tuple[str, str] | None,
    probe_every: float,
    yield_after: float,
) -> Verdict:
    """The verdict for node `me` from every node's row and the lease (`leader`: the fresh
    lease's (node, instance), None when no node leads).

    This node is ready when its own row says so and is fresh (a row that stopped being renewed
    is a daemon that stopped probing). A standby is unhealthy when it is not ready, or when the
    leader's stored intake has been dead or latched past `yield_after` and no node other than
    the leader is ready to take the work over (the leader would have yielded otherwise)."""
    limit = fresh_within(probe_every)
    mine = next((row for row in rows if row.node == me), None)
    reason: str | None
    if mine is None:
        ready, reason = False, "this node has not reported its readiness yet"
    elif mine.seen_age_s > limit:
        ready = False
        reason = f"this node last reported {_ago(mine.seen_age_s)} ago (is its daemon running?)"
    else:
        ready, reason = mine.ready, (None if mine.ready else mine.reason or "not ready")
    held = None
    if leader is not None:
        held = next((r for r in rows if (r.node, r.instance) == leader), None)
    live = held is not None and held.seen_age_s <= limit and held.intake == "live"
    problems: list[str] = []
    if not ready:
        problems.append(f"not ready: {reason}")
    if held is not None and held.intake in ("dead", "latched"):
        age = held.intake_age_s or 0.0
        others = ready_peers(
            rows, me=held.node, fingerprint=held.fingerprint, probe_every=probe_every
        )
        if age > yield_after and not others:
            problems.append(
                f"the leader {held.node!r} has had its intake {held.intake} for {_ago(age)}"
                " and no node is ready to take the work over"
            )
    return Verdict(ready, reason, held, live, tuple(problems))


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
