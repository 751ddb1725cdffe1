"""The fallback topic's buttons attacked (issue 35, DESIGN.md section 13): as a hostile network,
a lost phone, an operator and a crash would. On both engines, over real sockets: the owner
sender publishes through the ntfy emulator, the buttons are read back from its cache as the app
gets them and pressed as it presses them (the world of test_owner_buttons.py).

Each test is named after the failure it kills.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.flow.owner_replies import OwnerReplies
from ntfy_intake.rules import action_tokens
from ntfy_intake.store import audit, db, leadership, migrations, postgres, rebuild
from ntfy_intake.store import owner_replies as replies_store
from ntfy_intake.testbed.signal_standin import SignalHandle

from .. import harness
from ..owner_bed import OWNER, SENDER
from . import test_owner_replies as replies_world
from .test_owner_buttons import World, emu, press, world

pytestmark = pytest.mark.engines

__all__ = ["emu", "world"]  # the fixtures, shared with test_owner_buttons.py


def refire(world: World, incident_key: str) -> None:
    """The incident resolves and fires again: its version moves twice (rules/incidents.merge)."""
    with world.lock, db.write_txn(world.conn):
        world.conn.execute(
            "UPDATE incidents SET status = 'resolved', version = version + 1 WHERE key = ?",
            (incident_key,),
        )
    with world.lock, db.write_txn(world.conn):
        world.conn.execute(
            "UPDATE incidents SET status = 'firing', version = version + 1 WHERE key = ?",
            (incident_key,),
        )


def released_at(world: World, delivery_key: str, version: int) -> None:
    """The triage request was released at this incident version (store/outbox.release_due)."""
    with world.lock, db.write_txn(world.conn):
        world.conn.execute(
            "UPDATE outbox SET incident_version = ? WHERE delivery_key = ?",
            (version, delivery_key),
        )


# -- a lost phone: an old notification's button ------------------------------------------------


def test_old_ack_button_does_not_ack_a_later_firing_of_its_incident(world: World) -> None:
    """Failure mode: the owner clears last night's notification with its Ack button after the
    incident resolved and fired again; the new firing, which he has not seen, is acknowledged
    and its owner messages stop."""
    assert world.message("d1", "alerts:disk") == "queued"
    released_at(world, "d1", 1)
    world.send()
    old_ack = world.buttons_of("alerts:disk")["Ack"]
    refire(world, "alerts:disk")  # version 3: a new firing

    answer = press(old_ack)
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"] == "firing_over"
    assert world.message("d2", "alerts:disk") == "queued"  # the new firing still reaches him
    [line] = world.records("owner_reply")
    assert (line["result"], line["via"], line["key"]) == ("firing_over", "button", "notify:d1")
    assert press(old_ack).status_code == 409  # and stays spent


def test_ack_button_of_a_message_whose_firing_only_resolved_still_acts(world: World) -> None:
    """The limit of the above: an incident that resolved (and did not fire again) is still the
    firing the message was about; its Ack holds until it fires again, as over Signal."""
    assert world.message("d1", "alerts:disk") == "queued"
    released_at(world, "d1", 1)
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    with world.lock, db.write_txn(world.conn):
        world.conn.execute(
            "UPDATE incidents SET status = 'resolved', version = 2 WHERE key = 'alerts:disk'"
        )
    answer = press(ack)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == "acknowledged"
    assert world.message("d2", "alerts:disk") == "suppressed"
    with world.lock, db.write_txn(world.conn):
        world.conn.execute(
            "UPDATE incidents SET status = 'firing', version = 3 WHERE key = 'alerts:disk'"
        )
    assert world.message("d3", "alerts:disk") == "queued"


def test_ack_on_a_message_published_after_its_severity_rose_still_acts(world: World) -> None:
    """Failure mode: the firing is judged from the triage request's release, not from what the
    message showed: an escalation (or a slow agent's reply) published after the severity rose
    has its Ack refused as about a firing that is over, though it is the one on the phone."""
    assert world.message("d1", "alerts:disk") == "queued"
    released_at(world, "d1", 1)
    with world.lock, db.write_txn(world.conn):
        world.conn.execute(
            "UPDATE incidents SET severity = 5, version = 2 WHERE key = 'alerts:disk'"
        )
    world.send()  # published at version 2
    answer = press(world.buttons_of("alerts:disk")["Ack"])
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == "acknowledged"
    assert world.message("d2", "alerts:disk") == "suppressed"


# -- a hostile network ----------------------------------------------------------------------------


def test_used_token_pressed_again_and_again_is_throttled_not_an_audit_flood(
    world: World,
) -> None:
    """Failure mode: whoever read the fallback topic holds a spent token and presses it without
    end; every press was a write transaction and an audit line, never held."""
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    assert press(ack).status_code == 200
    statuses = [press(ack).status_code for _ in range(8)]
    assert statuses[:5] == [409] * 5
    assert statuses[5:] == [429] * 3
    assert len(world.records("owner_reply")) == 6  # one effect, five refusals, held ones none


def test_huge_binary_or_query_borne_token_acts_on_nothing(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    huge = httpx.post(ack["url"], content=b"A." * 32_768, timeout=30)
    binary = httpx.post(ack["url"], content=bytes(range(256)) * 4, timeout=10)
    in_query = httpx.post(ack["url"], params={"token": ack["body"]}, content=b"", timeout=10)
    assert [r.status_code for r in (huge, binary, in_query)] == [403, 403, 403]
    assert {r.json()["why"] for r in (huge, binary, in_query)} == {"malformed"}
    assert world.message("d2", "alerts:disk") == "queued"
    assert ack["body"] not in str(world.records("owner_reply"))


def test_concurrent_presses_of_one_button_have_one_effect(world: World) -> None:
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    silence = world.buttons_of("alerts:disk")["Silence 2h"]
    statuses: list[int] = []
    barrier = threading.Barrier(6)

    def one() -> None:
        barrier.wait()
        statuses.append(press(silence).status_code)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(statuses) == [200] + [409] * 5
    assert len(world.records("silence")) == 1


def test_ack_and_silence_of_one_message_both_act_once(world: World) -> None:
    """Two buttons, two tokens: each acts once; neither spends the other."""
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    buttons = world.buttons_of("alerts:disk")
    assert press(buttons["Ack"]).status_code == 200
    assert press(buttons["Silence 2h"]).status_code == 200
    assert [press(b).status_code for b in buttons.values()] == [409, 409]
    assert len(world.records("silence")) == 1
    assert [r["result"] for r in world.records("owner_reply")][:2] == ["acknowledged", "silenced"]


# -- an operator: the public URL, and the store moved ----------------------------------------------


@pytest.mark.parametrize(
    "public_url",
    [
        "http://127.0.0.1:{port}/",
        "http://127.0.0.1:{port}/intake,a;b=c/'x'",
        "http://[::1]:{port}/prefix/",
    ],
)
def test_public_url_with_separators_is_read_back_by_ntfy_exactly(
    world: World, public_url: str
) -> None:
    """Failure mode: a comma, semicolon, `=` or quote in http.public_url ends a term of ntfy's
    simple Actions form, so the app POSTs to a truncated URL (or the publish is refused)."""
    assert world.buttons is not None
    port = world.url.rsplit(":", 1)[1]
    url = public_url.format(port=port)
    world.buttons.public_url = url
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    actions = world.buttons_of("alerts:disk")
    assert actions["Ack"]["url"] == url.rstrip("/") + "/v1/owner/buttons/ack"
    assert actions["Silence 2h"]["url"] == url.rstrip("/") + "/v1/owner/buttons/silence_2h"
    assert actions["Ack"]["body"].count(".") == 1


@pytest.mark.slow
@pytest.mark.one_engine("store copy's target is PostgreSQL")
@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_store_copy_keeps_the_buttons_key_and_spent_tokens(tmp_path: Path) -> None:
    """Failure mode: after `store copy` to PostgreSQL every button on the owner's phone is
    refused as "not a button token of this daemon" (and counted as a guess); copying the key
    without the spent tokens would let each spent button act again."""
    state = tmp_path / "state"
    state.mkdir()
    conn = db.connect(state / "intake.sqlite3")
    migrations.apply(conn)
    conn.close()
    secret = os.urandom(action_tokens.KEY_BYTES).hex()
    raw = sqlite3.connect(state / "intake.sqlite3")
    with raw:
        raw.execute("INSERT INTO owner_action_key VALUES (1, ?, 1.0)", (secret,))
        raw.execute("INSERT INTO owner_action_uses VALUES ('ack:notify:d1', 2.0, 'acknowledged')")
    raw.close()
    assert harness.DATABASE is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    env["NTFY_INTAKE_STATE_DIR"] = str(state)
    done = subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "store", "copy", "--to", harness.DATABASE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout + done.stderr
    pg = db.connect(harness.DATABASE, readonly=True)
    try:
        keys = [tuple(r) for r in pg.execute("SELECT id, secret FROM owner_action_key")]
        uses = [tuple(r) for r in pg.execute("SELECT token_id, result FROM owner_action_uses")]
    finally:
        pg.close()
    assert keys == [(1, secret)]
    assert uses == [("ack:notify:d1", "acknowledged")]


# -- a crash: the store rebuilt from the audit log ----------------------------------------------


@pytest.mark.sqlite_only(reason="the audit fold is the same on both engines; two stores on one")
def test_ack_survives_a_rebuild_when_a_clear_frame_followed_it(tmp_path: Path) -> None:
    """Failure mode: live, a message_clear frame for an acked incident changes nothing (the
    incident's version stays, the ack holds); rebuilt from the audit log, its event line (no
    severity, no status) counts as a change, the ack is dropped as ended and the owner is
    messaged again about an incident he acknowledged. The rebuilt severity is lost too."""
    now = 1_764_470_000.0
    first = db.connect(tmp_path / "first.sqlite3")
    migrations.apply(first)
    with db.write_txn(first):
        audit.stage(
            first,
            "event",
            now,
            event_id="e1",
            incident="alerts:disk",
            severity=4,
            status="firing",
            outcome="recorded",
            reason="new_incident",
            time=int(now),
        )
    with db.write_txn(first):
        audit.stage(
            first,
            "owner_reply",
            now + 1,
            command="ack",
            result="acknowledged",
            via="button",
            key="notify:d1",
            incident="alerts:disk",
            matched="token",
        )
    with db.write_txn(first):  # what cadence_records.action_record writes for the frame
        audit.stage(
            first,
            "event",
            now + 2,
            event_id="e2",
            event="message_clear",
            incident="alerts:disk",
            outcome="noted",
            reason="message_clear",
            topic="alerts",
            time=int(now) + 2,
        )
    with audit.AuditLog(tmp_path / "audit", lambda: now) as log:
        audit.flush(first, log)
    first.close()
    second = db.connect(tmp_path / "second.sqlite3")
    migrations.apply(second)
    try:
        summary = rebuild.from_audit(
            second,
            tmp_path / "audit",
            now + 10,
            debounce=0.0,
            relay_enabled=True,
            feed_append=None,
        )
        assert summary is not None
        state = replies_store.incident_state(second, "alerts:disk")
        with db.write_txn(second):
            holds = replies_store.ack_holds(second, "alerts:disk")
    finally:
        second.close()
    assert state == (4, "firing", 1)  # as live: a clear frame merges into nothing
    assert holds


def test_quoted_ack_of_an_old_message_does_not_ack_a_later_firing(
    conn: db.Connection, tmp_path: Path, signal: SignalHandle
) -> None:
    """Failure mode: the same as the old button's, over Signal: the owner swipes last night's
    message and types "ack" after the incident resolved and fired again; the new firing, which
    he has not seen, is acknowledged."""
    replies_world.incident(conn, "alerts:disk")
    made = replies_world.World(conn, tmp_path, signal)
    assert made.message("d1", "alerts:disk") == "queued"

    async def scenario(sender: OwnerSender, replies: OwnerReplies) -> None:
        await sender.run_once()
        [sent] = made.signal.messages()
        replies_world.incident(conn, "alerts:disk", status="resolved", version=2)
        replies_world.incident(conn, "alerts:disk", status="firing", version=3)
        made.signal.inbox.inject(SENDER, OWNER, "ack", quote=sent.timestamp)
        await replies.run_once()

    made.run(scenario)
    assert made.message("d2", "alerts:disk") == "queued"


def test_burst_of_forged_presses_is_held_after_five_not_all_checked(world: World) -> None:
    """Failure mode: the per-address throttle is checked before a press and counted after it,
    so presses sent at once all pass the check: a burst of forged tokens from one address is
    one write transaction and one audit line each instead of five and then 429. The store's
    work runs in a worker thread, as the daemon's (flow/database.py), not on the event loop."""

    async def in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def locked() -> Any:
            with world.lock:
                return fn(*args, **kwargs)

        return await asyncio.to_thread(locked)

    assert world.buttons is not None
    world.buttons.run_db = in_thread
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    statuses: list[int] = []
    barrier = threading.Barrier(30)

    def one(i: int) -> None:
        barrier.wait()
        statuses.append(press(ack, body=f"guess{i}.AAAA").status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(statuses) == 30
    assert set(statuses) <= {403, 429, 503}
    assert statuses.count(403) <= 5
    assert len(world.records("owner_reply")) <= 5


def test_credentials_in_public_url_never_reach_the_fallback_topic(world: World) -> None:
    """Failure mode: an operator puts his reverse proxy's basic-auth user and password into
    http.public_url; every button's URL carries them to the ntfy server's cache and to every
    subscriber of the fallback topic."""
    assert world.buttons is not None
    port = world.url.rsplit(":", 1)[1]
    world.buttons.public_url = f"http://henk:s3cret-pw@127.0.0.1:{port}"
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    [message] = world.published()
    assert "s3cret-pw" not in str(message)
    assert "actions" not in message  # no buttons rather than a leaked password


def test_forged_presses_from_many_addresses_are_held_overall(world: World) -> None:
    """Failure mode: a guesser spreading forged tokens over many addresses (here through a
    reverse proxy on this box, each a different X-Forwarded-For) is never held, as each
    address stays under its own five."""
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    statuses = []
    for i in range(45):
        answer = httpx.post(
            ack["url"],
            content=f"guess{i}.AAAA".encode(),
            headers={"X-Forwarded-For": f"198.51.100.{i + 1}"},
            timeout=10,
        )
        statuses.append(answer.status_code)
    assert statuses[:30] == [403] * 30
    assert set(statuses[30:]) == {429}
    assert len(world.records("owner_reply")) == 30


@pytest.mark.sqlite_only(reason="the audit fold is the same on both engines; two stores on one")
@pytest.mark.parametrize(
    ("lines", "holds"),
    [
        # (status of each event line, or "ack"), whether the ack holds after the last one, as
        # rules/owner_replies.ack_current decides it live
        (("firing", "ack", "resolved"), True),
        (("firing", "ack", "resolved", "firing"), False),
        (("firing", "resolved", "ack", "firing"), False),
        (("firing", "resolved", "firing", "ack"), True),
        (("firing", "ack", "resolved", "firing", "resolved"), False),
    ],
)
def test_rebuilt_ack_holds_exactly_when_the_live_one_did(
    tmp_path: Path, lines: tuple[str, ...], holds: bool
) -> None:
    """Failure mode: rebuilt from the audit log, an ack that had ended (the incident fired
    again) holds again, or one that held is dropped: the owner hears of an incident he acked,
    or does not hear of a new firing."""
    now = 1_764_470_000.0
    first = db.connect(tmp_path / "first.sqlite3")
    migrations.apply(first)
    for n, line in enumerate(lines):
        with db.write_txn(first):
            if line == "ack":
                audit.stage(
                    first,
                    "owner_reply",
                    now + n,
                    command="ack",
                    result="acknowledged",
                    via="button",
                    key="notify:d1",
                    incident="alerts:disk",
                    matched="token",
                )
            else:
                audit.stage(
                    first,
                    "event",
                    now + n,
                    event_id=f"e{n}",
                    incident="alerts:disk",
                    severity=4,
                    status=line,
                    outcome="recorded",
                    reason="r",
                    time=int(now) + n,
                )
    with audit.AuditLog(tmp_path / "audit", lambda: now) as log:
        audit.flush(first, log)
    first.close()
    second = db.connect(tmp_path / "second.sqlite3")
    migrations.apply(second)
    try:
        rebuild.from_audit(
            second,
            tmp_path / "audit",
            now + 99,
            debounce=0.0,
            relay_enabled=True,
            feed_append=None,
        )
        with db.write_txn(second):
            rebuilt = replies_store.ack_holds(second, "alerts:disk")
    finally:
        second.close()
    assert rebuilt is holds


def test_press_on_a_leader_whose_term_just_ended_is_a_503_not_a_500(world: World) -> None:
    """Failure mode: a failover between the press's lease check and its write: the write is
    fenced (rolled back, as it must be) and the phone got a 500 "internal" instead of the
    standby's 503, with the failover logged as an unhandled error."""
    if not isinstance(world.conn, postgres.PgConnection):
        pytest.skip("leadership and its fence are PostgreSQL's")
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    with world.lock:
        term = leadership.claim(world.conn, "pi", "inst-a", 8.0).row.term
        world.conn.execute("UPDATE leadership SET term = term + 1")  # another node took over
        world.conn.term = term
    answer = press(ack)
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"] == "standby"
    with world.lock:
        world.conn.term = None
    assert press(ack).status_code == 200  # the fenced press spent nothing


def test_press_whose_process_died_before_answering_acted_once_with_one_line(
    world: World,
) -> None:
    """Failure mode: kill -9 after the press's COMMIT and before the audit flush and the answer:
    the phone saw no answer and the owner presses again; the effect must not happen twice and
    the audit log must still get the first press's line (from the journal, at the next start),
    once."""
    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    ack = world.buttons_of("alerts:disk")["Ack"]
    assert world.buttons is not None
    with world.lock:
        done = world.buttons._press("ack", ack["body"], "127.0.0.1")  # committed, not flushed
    assert done.status == 200
    assert world.records("owner_reply") == []  # the process dies here: nothing in the files
    asyncio.run(world.flush())  # the next start flushes the journal
    again = press(ack)
    assert again.status_code == 409
    assert [r["result"] for r in world.records("owner_reply")] == ["acknowledged", "already_done"]
    assert world.message("d2", "alerts:disk") == "suppressed"


def test_presses_while_the_store_waits_out_an_outage_are_503_not_parked(world: World) -> None:
    """Failure mode: the daemon's store waits a PostgreSQL outage out for ever
    (flow/database.py), and every press meanwhile was parked on it, unchecked by the throttle,
    to act all at once when the store returns. The store's work runs in a worker thread, and
    the outage is that thread blocked on the store."""

    entered = threading.Event()

    async def in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def locked() -> Any:
            entered.set()
            with world.lock:
                return fn(*args, **kwargs)

        return await asyncio.to_thread(locked)

    assert world.message("d1", "alerts:disk") == "queued"
    world.send()
    buttons = world.buttons_of("alerts:disk")
    assert world.buttons is not None
    world.buttons.run_db = in_thread
    first: list[int] = []
    with world.lock:  # the outage begins
        waiting = threading.Thread(target=lambda: first.append(press(buttons["Ack"]).status_code))
        waiting.start()
        assert entered.wait(10)  # the first press is in the store's thread, blocked
        later = press(buttons["Silence 2h"])  # waits BUSY_WAIT for the first, then gives up
        assert later.status_code == 503, later.text
        assert later.json()["error"] == "busy"
        assert first == []
    waiting.join(30)  # the outage ends: the first press acts
    assert first == [200]
    assert world.records("silence") == []
    assert press(buttons["Silence 2h"]).status_code == 200  # and the busy one spent nothing
