"""What the daemon tells the owner about its own trouble: the wording and the stable keys.

Pure. Each key names what the notice is about, so a repeat of the same trouble (a restart, a
retry) reuses the key and the owner outbox sends it once; the per-kind rate limit
(`cadence.Policy.notice_limit`) bounds the rest. docs/operations.md explains each one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass(frozen=True, slots=True)
class Notice:
    """An operational notice for the owner (fallback_400, gap, latch, dead_row, intake_dead...)."""

    notice: str
    text: str
    key: str
    fields: dict[str, str] = field(default_factory=dict)


def fallback_400(cursor_value: str, since: str, detail: str) -> Notice:
    return Notice(
        "fallback_400",
        f"ntfy rejected the saved cursor since={since!r} ({detail}); replaying everything the "
        "server still holds. Nothing is lost; duplicates are absorbed.",
        key=f"fallback_400:{cursor_value}",
    )


def gap(cursor_value: str, window_start: str, window_end: str) -> Notice:
    return Notice(
        "gap",
        f"Possible alert loss: ntfy no longer holds the last recorded message ({cursor_value}). "
        f"Anything published between {window_start} and {window_end} that is not in the audit "
        "log may be gone for good.",
        key=f"gap:{cursor_value}",
        fields={"window_start": window_start, "window_end": window_end, "cursor": cursor_value},
    )


_REFUSALS = {
    "credentials": "the credentials were refused (check ntfy.token)",
    "acl": "the token may not read these topics (ntfy access control)",
    "rate_limit": "ntfy's rate limit was reached",
    "rejected": "ntfy rejected the request",
}


def subscribe_refused(
    category: str, status: int, code: int | None, error: str, topics: str, episode: str
) -> Notice:
    """One per category per episode (until a subscription opens again). The cursor is kept."""
    said = f"{code}: {error}" if code is not None else error
    return Notice(
        "subscribe_refused",
        f"ntfy refused the subscription to {topics}: {_REFUSALS.get(category, category)} "
        f"(HTTP {status}, {said!r}). Retrying with backoff; the cursor is kept and nothing "
        "published meanwhile is lost while ntfy's cache holds it.",
        key=f"subscribe_refused:{category}:{episode}",
        fields={"category": category, "topics": topics, "error": said},
    )


def latch(detail: str, boot_id: str) -> Notice:
    """One per process: the latch trips once and stays until a restart."""
    return Notice(
        "latch",
        f"The audit log cannot be written ({detail}). Intake keeps recording, but the cursor is "
        "frozen until a restart; free the disk or fix permissions, then restart.",
        key=f"latch:{boot_id}",
    )


def intake_dead(dead_after: float, last_error: str | None, episode: str) -> Notice:
    return Notice(
        "intake_dead",
        f"No frame from ntfy for over {dead_after:g}s (last error: {last_error or 'none'}). "
        "Alerts published now are held by ntfy's cache and will be recorded when the "
        "connection returns.",
        key=f"intake_dead:{episode}",
    )


def intake_recovered(episode: str) -> Notice:
    return Notice(
        "intake_recovered",
        "ntfy is reachable again; intake is live and replaying what it missed.",
        key=f"intake_recovered:{episode}",
    )


def dead_row(delivery_key: str, detail: str, attempts: int) -> Notice:
    return Notice(
        "dead_row",
        f"Triage request {delivery_key} could not be delivered ({detail}) after {attempts} "
        f"attempt(s). `ntfy-intake redrive {delivery_key}` retries it.",
        key=f"dead_row:{delivery_key}:{attempts}",
    )


def audit_file_replaced(detail: str, boot_id: str, count: int) -> Notice:
    return Notice(
        "audit_file_replaced",
        f"The audit log was changed under the running daemon: {detail}. Recording goes on in "
        "the file at its path; nothing recorded is lost.",
        key=f"audit_file_replaced:{boot_id}:{count}",
    )


def database_locked(holder: str, boot_id: str) -> Notice:
    return Notice(
        "db_locked",
        f"The database is locked by another process ({holder}); intake waits with backoff and "
        "loses nothing. Health is degraded until the lock is released.",
        key=f"db_locked:{boot_id}",
    )


def storage_fault(kind: str, description: str, boot_id: str) -> Notice:
    """`kind` and `description` of a storage.StorageFault (disk_full, io, ...)."""
    return Notice(
        "storage_fault",
        f"Storage trouble: {description}. Intake waits and retries; free space or fix the cause.",
        key=f"storage_fault:{kind}:{boot_id}",
    )


def rebuilt_from_audit(summary: str, boot_id: str) -> Notice:
    return Notice(
        "rebuilt_from_audit",
        f"The database was missing or empty and was rebuilt from the audit log ({summary}). "
        "Agent feed cursors cannot be known and restart at each channel's head; undelivered "
        "triage requests and owner messages are pending again under their old keys.",
        key=f"rebuilt_from_audit:{boot_id}",
    )


def clock_jump(detail: str, boot_id: str, count: int) -> Notice:
    return Notice(
        "clock_jump",
        f"The local clock disagrees with ntfy's frame times ({detail}); cadence and retention "
        "follow the server's time until they agree again.",
        key=f"clock_jump:{boot_id}:{count}",
    )


def relay_unauthorized(delivery_key: str, attempt: int, detail: str) -> Notice:
    """Once per streak of 401s: the key of the attempt that started it keeps it stable."""
    return Notice(
        "relay_unauthorized",
        f"The triage receiver refused triage request {delivery_key} ({detail}): check that "
        "relay.secret (and relay.token) match the receiver's and that both clocks are synced. "
        "The daemon keeps retrying with backoff; nothing is dropped.",
        key=f"relay_unauthorized:{delivery_key}:{attempt}",
    )


def takeover(node: str, before_node: str, term: int, previous_term: int) -> Notice:
    """One per term: the node that took the lease over says from whom (DESIGN.md section 9)."""
    return Notice(
        "takeover",
        f"Failover: node {node!r} leads now (term {term}); node {before_node!r} (term"
        f" {previous_term}) gave the lease up or stopped renewing it. Intake resumes from the"
        " durable cursor with an overlap backfill: nothing recorded is lost or counted twice.",
        key=f"takeover:{term}",
        # No `term` field: the audit line's envelope carries the term it was written under.
        fields={"node": node, "previous_node": before_node, "previous_term": str(previous_term)},
    )


def yielded(node: str, to: str, reason: str, term: int) -> Notice:
    """One per hand-over (DESIGN.md section 11): the leader that cannot do the work gives the
    lease to a ready node. Its key is the next term's takeover key: the yielding leader records
    it under its own term before it releases, and the next leader's takeover notice for that
    same term is then a no-op, so the owner hears once whether or not the yielder lived to
    release (runtime/yielding.py)."""
    return Notice(
        "yielded",
        f"{node} yielded to {to}: {reason}. Node {node!r} gave up the lease (term {term}) for"
        f" node {to!r}, which reaches ntfy; it resumes from the durable cursor with an overlap"
        " backfill, so nothing ntfy still holds is lost or counted twice.",
        key=f"takeover:{term + 1}",
        fields={"node": node, "to": to, "reason": reason, "previous_term": str(term)},
    )


def login_throttled(address: str, failures: int, hold_s: float, episode: str) -> Notice:
    """One per episode of failed logins (rules/login_throttle.py): `address` the client (or its
    IPv6 /64), "*" for every address together. Never names a token that was tried."""
    if address == "*":
        who = f"Failed logins from many addresses ({failures} wrong HTTP tokens within a minute)"
        held = (
            f"every address that has not logged in within a day is refused (429) for "
            f"{hold_s:g} s; loopback and the owner's recent addresses are not"
        )
    else:
        where = "this box (loopback: a local process)" if address == "loopback" else address
        who = f"Failed logins from {where}: {failures} wrong HTTP tokens within a minute"
        held = f"its attempts are refused (429) for {hold_s:g} s"
    return Notice(
        "login_throttled",
        f"{who}; {held}, doubling while failures go on (at most 15 min). No one got in. If this "
        "is not you, find who reaches the HTTP port; `ntfy-intake token` prints a new http.token.",
        key=f"login_throttled:{address}:{episode}",
        fields={"address": address, "failures": str(failures)},
    )


def work_differs(leader: str, node: str, keys: list[str], theirs: str, mine: str) -> Notice:
    """Once per pair of fingerprints (DESIGN.md section 11): a node whose work settings differ
    from the leader's is not ready and never campaigns (it would lose or double alerts). Names
    the differing KEYS only, never their values (rules/readiness.py)."""
    return Notice(
        "work_differs",
        f"Node {node!r} is configured for different work than the leader {leader!r}"
        f" ({', '.join(keys)} differ): it will not take over while they differ, so it is no"
        " standby for this work. Give both nodes the same values for these keys.",
        key=f"work_differs:{node}:{theirs}:{mine}",
        fields={"node": node, "leader": leader, "keys": ",".join(keys)},
    )


def database_outage(seconds: float, node: str, term: int | None, episode: str) -> Notice:
    """Once per database outage longer than the lease (rules/outage.py), recorded by whichever
    node leads once the store answers. The key: the term before it (the same on every node that
    saw it), or this process's `episode` when no term was seen yet."""
    before = "no term yet" if term is None else f"term {term}"
    return Notice(
        "database_outage",
        f"The database did not answer for {seconds:.0f} s (seen by node {node!r}; {before}"
        " before it): longer than the lease, so no node could lead meanwhile. It answers again;"
        " intake resumed from the durable cursor with an overlap backfill, so nothing ntfy"
        " still holds is lost or counted twice (a gap notice follows if ntfy dropped some).",
        key=f"database_outage:{episode if term is None else f'term-{term}'}",
        fields={"node": node, "seconds": f"{seconds:.0f}"},
    )


def expect_missed(
    name: str, topic: str, every: str, window_start: str, key: str, heard: bool
) -> Notice:
    """Once per episode of an `[[expect]]` entry (rules/expectations.py): nothing matching
    arrived within every + grace of `window_start` (the last arrival, or the daemon's start
    when none is known)."""
    since = f"since {window_start}" if heard else f"since the daemon started at {window_start}"
    return Notice(
        "expect_missed",
        f"Expected {name!r} (topic {topic}) at least every {every}; nothing has arrived {since}."
        " The publisher may have stopped (a job that died, a failed send that is never retried)."
        " One more notice follows when it is heard from again.",
        key=key,
        fields={"expectation": name, "topic": topic, "window_start": window_start},
    )


def expect_back(name: str, topic: str, window_start: str, arrived: str, key: str) -> Notice:
    """Once per episode: a matching message arrived again after `expect_missed`."""
    return Notice(
        "expect_back",
        f"{name!r} (topic {topic}) is heard from again: a message published at {arrived},"
        f" after silence since {window_start}.",
        key=key,
        fields={
            "expectation": name,
            "topic": topic,
            "window_start": window_start,
            "arrived": arrived,
        },
    )


def topic_refused(
    topic: str, status: int, code: int | None, error: str, streaming: str, episode: str
) -> Notice:
    """One per refused topic per episode (flow/intake.py, rules/topic_access.py): ntfy refused
    this topic alone; the others stream on. `episode`: when it began (Unix seconds)."""
    said = f"{code}: {error}" if code is not None else error
    why = _REFUSALS["acl"] if status == 403 else _REFUSALS["rejected"]
    return Notice(
        "topic_refused",
        f"ntfy refused topic {topic!r}: {why} (HTTP {status}, {said!r}). The other topics"
        f" ({streaming}) are streamed without it; {topic!r} is tried again with backoff and its"
        " backlog is fetched while ntfy's cache still holds it. Grant the token read access"
        f" to {topic!r} (`ntfy access <user> {topic} read`) or remove it from ntfy.topics.",
        key=f"topic_refused:{topic}:{episode}",
        fields={"topic": topic, "status": str(status), "error": said},
    )


def utc_day(server_time: int) -> str:
    """The UTC calendar day of a server time, as in the `unreplayable` notice's key."""
    return datetime.fromtimestamp(server_time, UTC).strftime("%Y-%m-%d")


def unreplayable(topic: str, day: str) -> Notice:
    """The first message without `expires` per topic per UTC day: ntfy did not cache it, so a
    disconnect at the wrong moment loses it for good. The key names topic and day, so a restart
    that sees another one the same day adds nothing."""
    return Notice(
        "unreplayable",
        f"Topic {topic!r} carries messages ntfy does not cache (no `expires`: published with"
        " `Cache: no`). They are recorded when they arrive, but ntfy never replays them, so one"
        " lost connection loses them for good. Turn caching back on at the publisher: drop the"
        " `Cache: no` / `X-Cache: no` header (`?cache=no` in the URL); in Gatus, remove"
        " `disable-cache: true` from the ntfy alerting provider.",
        key=f"unreplayable:{topic}:{day}",
        fields={"topic": topic, "day": day},
    )


def reply_path_dead(dead_after: float, last_error: str | None, episode: str) -> Notice:
    """Receiving the owner's replies over Signal has failed for `dead_after`: once per episode
    (until a receive succeeds again), sent through the fallback topic when one is set."""
    return Notice(
        "reply_path_dead",
        f"Your replies over Signal cannot be read: receiving has failed for over {dead_after:g}s "
        f"(last error: {last_error or 'none'}). ack, silence and the rest are not seen until it "
        "works again; use the console meanwhile. Alerts still reach you.",
        key=f"reply_path_dead:{episode}",
    )


def reply_path_recovered(episode: str) -> Notice:
    """Receiving the owner's replies works again after a `reply_path_dead` episode: once per
    episode (the same `episode` as its dead notice), so the owner knows replies count again."""
    return Notice(
        "reply_path_recovered",
        "Your replies over Signal are read again: ack, silence and the rest work. A reply you "
        "sent while receiving failed may not have been seen: send it again if it got no answer.",
        key=f"reply_path_recovered:{episode}",
    )
