"""The `[cluster]` rules: this node's name and the lease timing (DESIGN.md section 9).

Invariants owned here:
- `node` is non-empty, printable, without whitespace and at most 63 characters, whether given or
  the host name (the default); on PostgreSQL a host name that breaks these rules is a ConfigError
  asking for `cluster.node`, on SQLite (nothing reads the node) it is made to fit instead;
- `lease_ttl` and `renew_every` are durations longer than 0s that pass `lease.check_timing`
  (lease_ttl at least 3 x renew_every), reported on the key that was given;
- `probe_every` and `yield_after` are longer than 0s, `yield_cooloff` at least 0s, and
  yield_after is at least 3 x probe_every (DESIGN.md section 11), reported on the key given;
- any `[cluster]` key given (file or environment) without `[state] database` is one ConfigError:
  a standby shares one database with its leader, a SQLite file cannot be shared.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from ntfy_intake.rules import lease
from ntfy_intake.rules.durations import format_duration
from ntfy_intake.settings.rules import _duration, _Reader, _url
from ntfy_intake.settings.schema import (
    _SECTIONS,
    DEFAULT_LEASE_TTL,
    DEFAULT_PROBE_EVERY,
    DEFAULT_RENEW_EVERY,
    DEFAULT_YIELD_AFTER,
    DEFAULT_YIELD_COOLOFF,
    MAX_NODE_LENGTH,
    ClusterSettings,
    env_name,
)

NEEDS_DATABASE = (
    "[cluster] needs [state] database (PostgreSQL): a standby shares one database with its leader"
)


def _cluster(r: _Reader, *, postgres: bool) -> ClusterSettings:
    """The per-key rules; the cross-key ones are `_cluster_fits` (checked once, after these)."""
    return ClusterSettings(
        node=_node(r, postgres=postgres),
        lease_ttl=_duration(r, "cluster", "lease_ttl", DEFAULT_LEASE_TTL, 0.0, strict=True),
        renew_every=_duration(r, "cluster", "renew_every", DEFAULT_RENEW_EVERY, 0.0, strict=True),
        url=_advertised(r),
        probe_every=_duration(r, "cluster", "probe_every", DEFAULT_PROBE_EVERY, 0.0, strict=True),
        yield_after=_duration(r, "cluster", "yield_after", DEFAULT_YIELD_AFTER, 0.0, strict=True),
        yield_cooloff=_duration(r, "cluster", "yield_cooloff", DEFAULT_YIELD_COOLOFF, 0.0),
        configured=bool(_given(r)),
    )


def _cluster_fits(r: _Reader, cluster: ClusterSettings | None, *, postgres: bool) -> None:
    """The rules across keys and sections: the engine, then the timing (when every key was good)."""
    given = _given(r)
    if given and not postgres:
        r.fail("cluster", given[0], NEEDS_DATABASE)
    if cluster is None:
        return
    problem = lease.check_timing(cluster.lease_ttl, cluster.renew_every)
    if problem is not None:
        # Name the key the operator wrote: the default lease_ttl is nobody's mistake.
        given_ttl = r.has("cluster", "lease_ttl") or not r.has("cluster", "renew_every")
        key = "lease_ttl" if given_ttl else "renew_every"
        r.fail("cluster", key, problem)
    if cluster.yield_after < 3 * cluster.probe_every:
        # What a leader knows of a peer is up to three probes old (the peer reports up to 1.5
        # probes after a change, the leader reads the rows up to 1.5 probes before it decides):
        # with a shorter yield_after, a standby cut off at the leader's instant would still read
        # ready when the leader yields to it.
        given_after = r.has("cluster", "yield_after") or not r.has("cluster", "probe_every")
        r.fail(
            "cluster",
            "yield_after" if given_after else "probe_every",
            f"yield_after ({format_duration(cluster.yield_after)}) must be at least 3 x"
            f" probe_every ({format_duration(cluster.probe_every)})",
        )


def _advertised(r: _Reader) -> str | None:
    url = _url(r, "cluster", "url", query=False)
    if url is not None and urlsplit(url).path.strip("/"):
        r.fail("cluster", "url", "give the base URL (http://host:port): /console is added to it")
    return None if url is None else url.rstrip("/")


def _given(r: _Reader) -> list[str]:
    return [key for key in _SECTIONS["cluster"] if r.has("cluster", key)]


def _node(r: _Reader, *, postgres: bool) -> str:
    text = r.text("cluster", "node")  # non-empty and printable, or a ConfigError
    if text is not None:
        problem = node_problem(text)
        if problem is not None:
            r.fail("cluster", "node", f"{problem}, got {r.show('cluster', 'node', text)}")
        return text
    try:
        host = socket.gethostname()
    except OSError:
        host = ""
    problem = node_problem(host)
    if problem is None:
        return host
    if postgres:
        r.fail(
            "cluster",
            "node",
            f"the host name {host[:80]!r} is no node name ({problem}):"
            f" set cluster.node or {env_name('cluster', 'node')}",
        )
    # SQLite: a single box, nothing reads the node; never a reason to refuse to start.
    fitted = "".join(c for c in host if c.isprintable() and not c.isspace())
    return fitted[:MAX_NODE_LENGTH] or "localhost"


def node_problem(name: str) -> str | None:
    """Why `name` cannot be a `[cluster] node`, or None when it can."""
    if not name:
        return "must not be empty"
    if not name.isprintable():
        return "must not contain control characters"
    if any(c.isspace() for c in name):
        return "must not contain whitespace"
    if len(name) > MAX_NODE_LENGTH:
        return f"must be at most {MAX_NODE_LENGTH} characters ({len(name)} here)"
    return None
