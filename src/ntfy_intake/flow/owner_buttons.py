"""The fallback topic's action buttons (DESIGN.md section 13): "Ack" and "Silence 2h" on every
owner message about an incident that goes to the ntfy fallback topic, when `http.public_url`
is set.

Two halves, both run in the database thread:
- `headers_for(key)`, for the owner sender right before a fallback publish: the `Actions`
  header with one signed token per button (rules/action_tokens.py), or nothing for a message
  that is about no incident (a notice, a confirmation, an agent's own notify);
- `press(action, token, address)`, for the button's POST (surfaces/owner_actions.py): the token
  verified, and then, in ONE write transaction, its use recorded (a second press finds it and
  acts no more), the effect (the very `act` a Signal reply runs: flow/owner_replies.py) and its
  `owner_reply` audit line with `"via": "button"`. A token refused (forged, malformed, made for
  the other button, expired) or already used writes one audit line and nothing else; so does
  an Ack on a message whose firing is over (the incident fired again or rose since: `firing_over`,
  the token spent), which would otherwise acknowledge a firing the owner has not seen.

The signing key is the store's (store/action_tokens.py), made on first use and then kept in
memory; it is never logged, audited or shown.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import structlog

from ntfy_intake.flow import owner_replies
from ntfy_intake.flow.owner import OwnerSender
from ntfy_intake.rules import action_tokens as tokens
from ntfy_intake.rules import owner_replies as reply_rules
from ntfy_intake.rules.owner_replies import Command
from ntfy_intake.store import action_tokens as store
from ntfy_intake.store import audit, db
from ntfy_intake.store import owner_replies as replies_store
from ntfy_intake.store.owner_queue import OwnerQueue
from ntfy_intake.wire.owner_channels import actions_header, button_url

log = structlog.get_logger("ntfy_intake.owner_buttons")

COMMANDS: dict[tokens.Action, Command] = {
    "ack": Command("ack"),
    "silence_2h": Command("silence", span=tokens.SILENCE_SPAN),
}
# What each refusal answers: a token past its expiry is gone (410), anything else forbidden.
_STATUS = {"malformed": 403, "forged": 403, "wrong_action": 403, "expired": 410}
_SAY = {
    "malformed": "that is not a button token of this daemon",
    "forged": "that is not a button token of this daemon",
    "wrong_action": "that token belongs to the other button",
    "expired": "that button has expired (24 h after its message); reply over Signal or use the console",
}


# An Ack pressed on a message whose firing ended (the incident fired again, or its severity
# rose): the owner acknowledges what he saw, never a firing he has not seen.
_FIRING_OVER = "firing_over"
_SAY_FIRING_OVER = (
    "that alert fired again (or got worse) since this message; nothing was acknowledged:"
    " use the newer message's button, a Signal reply or the console"
)


def _has_credentials(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.username is not None or parts.password is not None


def _firing_over(conn: db.Connection, verdict: tokens.Verified) -> bool:
    """Whether the firing the token's message showed (the incident's version when it was
    published) has ended: its Ack would hold a later one (the same test as an ack's end:
    rules/owner_replies.ack_current). A token that names no version acts as before."""
    incident = replies_store.incident_of(conn, verdict.key)
    state = None if incident is None else replies_store.incident_state(conn, incident)
    if verdict.version is None or state is None:
        return False
    _severity, status, version = state
    return not reply_rules.ack_current(verdict.version, status, version)


@dataclass(frozen=True, slots=True)
class Pressed:
    """A press's answer, and whether it counts as a failed login (a token refused)."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)
    failed_login: bool = False


class OwnerButtons:
    def __init__(
        self,
        conn: db.Connection,
        *,
        run_db: db.Runner,
        queue: OwnerQueue,
        public_url: str,
        clock: Callable[[], float],
        flush_audit: Callable[[], Awaitable[object]],
        may_act: Callable[[], bool] = lambda: True,
        ttl: float = tokens.TTL,
    ) -> None:
        self.conn = conn
        self.run_db = run_db
        self.queue = queue
        self.public_url = public_url
        self.clock = clock
        self.flush_audit = flush_audit
        self.may_act = may_act
        self.ttl = ttl
        self._secret: bytes | None = None  # the store's key, once read (after its COMMIT)

    # -- the sender's half -------------------------------------------------------------------------

    async def headers_for(self, key: str) -> dict[str, str]:
        """The `Actions` header for the owner message `key` on the fallback topic, or {}."""
        if not self.may_act():
            return {}
        return await self.run_db(self._headers, key)

    def _headers(self, key: str) -> dict[str, str]:
        if _has_credentials(self.public_url):
            # The URL goes to the ntfy server's cache and to every subscriber of the topic.
            log.warning("owner_buttons.credentials_in_url", detail="http.public_url has a user")
            return {}
        with db.write_txn(self.conn) as txn:
            incident = replies_store.incident_of(self.conn, key)
            state = None if incident is None else replies_store.incident_state(self.conn, incident)
            if state is None:
                return {}
            secret = self._signing_key(txn)
        now = self.clock()
        header = actions_header(
            [
                (
                    tokens.LABELS[action],
                    button_url(self.public_url, action),
                    tokens.sign(secret, key, action, now, self.ttl, version=state[2]),
                )
                for action in tokens.ACTIONS
            ]
        )
        if header is None:
            log.warning(
                "owner_buttons.unwritable_url", detail="http.public_url has quotes or non-ASCII"
            )
            return {}
        return {"Actions": header}

    def _signing_key(self, txn: db.Transaction) -> bytes:
        if self._secret is not None:
            return self._secret
        secret = store.signing_key(self.conn, secrets.token_bytes(tokens.KEY_BYTES), self.clock())

        def keep() -> None:
            self._secret = secret

        txn.after_commit(keep)
        return secret

    # -- the button's half ---------------------------------------------------------------------------

    async def press(self, action: tokens.Action, token: str, address: str) -> Pressed:
        """Verify `token` for the button `action` and act once (module doc)."""
        if not self.may_act():
            return Pressed(503, {"error": "standby", "message": "this node no longer leads"})
        pressed = await self.run_db(self._press, action, token, address)
        await self.flush_audit()
        return pressed

    def _press(self, action: tokens.Action, token: str, address: str) -> Pressed:
        conn = self.conn
        command = COMMANDS[action]
        now = self.clock()

        def line(result: str, **fields: Any) -> None:
            """The press's one `owner_reply` audit line, whatever became of it."""
            fields.setdefault("address", address[:100])
            audit.stage(
                conn,
                "owner_reply",
                now,
                command=command.verb,
                result=result,
                via="button",
                **fields,
            )

        with db.write_txn(conn) as txn:
            verdict = tokens.verify(self._signing_key(txn), token, action, now)
            if isinstance(verdict, tokens.Refused):
                why = verdict.why
                result = "expired" if why == "expired" else "refused"
                line(result, why=why, key=verdict.key)
                txn.after_commit(lambda: log.warning("owner_buttons.refused", why=why))
                said = {"error": result, "why": why, "message": _SAY[why]}
                return Pressed(_STATUS[why], said, failed_login=True)
            used = tokens.token_id(verdict.key, verdict.action)
            if not store.claim(conn, used, now, now - 2 * self.ttl):
                before = store.used_result(conn, used)
                line("already_done", key=verdict.key)
                message = "that button was pressed before; nothing more was done"
                # Counted like a refused token: a spent token (anyone who read the topic holds
                # one) pressed without end would otherwise be an unthrottled write and audit line.
                return Pressed(
                    409,
                    {"error": "already_done", "result": before, "message": message},
                    failed_login=True,
                )
            if command.verb == "ack" and _firing_over(conn, verdict):
                store.settle(conn, used, _FIRING_OVER)
                line(_FIRING_OVER, key=verdict.key)
                return Pressed(409, {"error": _FIRING_OVER, "message": _SAY_FIRING_OVER})
            fields: dict[str, Any] = {
                "key": verdict.key,
                "matched": "token",
                "address": address[:100],
            }
            result, words = owner_replies.act(
                conn, self.queue, txn, command, now, fields, via="button"
            )
            store.settle(conn, used, result)
            line(result, **fields)
        body: dict[str, Any] = {
            "result": result,
            "incident": fields.get("incident"),
            "message": words,
        }
        return Pressed(200 if result != "unmatched" else 422, body)


def attach(sender: OwnerSender, queue: OwnerQueue, public_url: str | None) -> OwnerButtons | None:
    """The buttons beside the owner sender (its store, clock, audit flush and lease), their
    header given to its fallback publishes; None without `http.public_url`."""
    if public_url is None:
        return None
    buttons = OwnerButtons(
        sender.conn,
        run_db=sender.run_db,
        queue=queue,
        public_url=public_url,
        clock=sender.clock,
        flush_audit=sender.flush_audit,
        may_act=sender.may_act,
    )
    sender.buttons = buttons.headers_for
    return buttons
