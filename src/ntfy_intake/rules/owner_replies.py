"""Replies from the owner's phone over Signal (DESIGN.md section 13): reading a received
envelope, telling the owner from a stranger, the command, which of our messages it answers, and
the confirmation text. Pure: plain values in, plain values out, no clock reads.

An item as signal-cli-rest-api's receive serves it (`{"envelope": {...}, "account": ...}`,
envelope fields as AsamK/signal-cli's JsonMessageEnvelope / JsonDataMessage / JsonQuote name
them): only a data message with text is a reply; receipts, typing notices, sync messages and
reactions are skipped. The envelope's (source, timestamp) is its identity: the daemon records
each once, so a replayed envelope changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ntfy_intake.rules import sanitize, silences

Verb = Literal["ack", "silence", "unsilence", "details", "status", "help", "unknown"]
VERBS: tuple[Verb, ...] = ("ack", "silence", "unsilence", "details", "status", "help")
# A reply without a quote answers the newest of our messages sent this recently.
NEWEST_WITHIN = 3600.0
# The verbs that need one of our messages about an incident to act on.
NEEDS_INCIDENT: frozenset[str] = frozenset({"ack", "silence", "unsilence", "details"})
MAX_SOURCE = 80  # an E.164 number or a UUID; anything longer is cut in the audit line
CONFIRMATION_LIMIT = 600
# At most this many confirmations and help texts per CONFIRM_WINDOW: past it a reply still acts
# and is audited, unanswered. Two automatons answering each other (a bot in owner.reply_from
# that replies to everything) would otherwise loop for ever.
CONFIRM_LIMIT = 20
CONFIRM_WINDOW = 3600.0
HELP = (
    "Reply to one of my messages (swipe to quote it) with: ack | silence 2h | unsilence | "
    "details | status | help. Without a quote I take the newest message of the last hour."
)


@dataclass(frozen=True, slots=True)
class Envelope:
    source: str  # the sender's number, else its UUID ("" when the envelope names neither)
    source_uuid: str | None
    timestamp: int  # the sender's ms timestamp: with `source`, the envelope's identity
    text: str
    quote_id: int | None  # the timestamp of the message it quotes


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _sender(value: object) -> str | None:
    text = _str(value)
    return None if text is None else _str(sanitize.strip_control(sanitize.valid_utf8(text)))


def parse_item(item: object) -> Envelope | None:
    """The reply an item carries, or None (not a text data message, or malformed)."""
    if not isinstance(item, Mapping):
        return None
    envelope = item.get("envelope")
    if not isinstance(envelope, Mapping):
        return None
    data = envelope.get("dataMessage")
    if not isinstance(data, Mapping):
        return None
    text = data.get("message")
    timestamp = _int(envelope.get("timestamp"))
    # The sender is stored and audited: no control character (PostgreSQL refuses NUL in text)
    # and valid UTF-8 whatever the decoder let through.
    number = _sender(envelope.get("sourceNumber")) or _sender(envelope.get("source"))
    uuid = _sender(envelope.get("sourceUuid"))
    if not isinstance(text, str) or timestamp is None or (number is None and uuid is None):
        return None
    quote = data.get("quote")
    quote_id = _int(quote.get("id")) if isinstance(quote, Mapping) else None
    return Envelope(
        source=(number or uuid or "")[:MAX_SOURCE],
        source_uuid=uuid,
        timestamp=timestamp,
        text=sanitize.valid_utf8(text),
        quote_id=quote_id,
    )


def is_owner(envelope: Envelope, allowed: Iterable[str]) -> bool:
    """Whether the sender is one of `allowed` (owner.recipients and owner.reply_from), by
    number or UUID. Group ids in `allowed` never match a sender."""
    names = {a for a in allowed if a and not a.startswith("group.")}
    return envelope.source in names or (
        envelope.source_uuid is not None and envelope.source_uuid in names
    )


@dataclass(frozen=True, slots=True)
class Command:
    verb: Verb
    span: float | None = None  # silence: seconds
    problem: str | None = None  # why it cannot run as typed (answered with help)


def parse_command(text: str) -> Command:
    """The first word, case-insensitive; `silence` takes a duration (1m to 24h, as the
    console's)."""
    words = sanitize.strip_control(text).split()
    if not words:
        return Command("unknown", problem="empty reply")
    verb = words[0].lower().rstrip(".!")
    if verb not in VERBS:
        return Command("unknown", problem=f"unknown command {sanitize.one_line(verb, 20)!r}")
    if verb == "silence":
        if len(words) < 2:
            return Command("silence", problem="silence needs a duration, e.g. silence 2h")
        try:
            return Command("silence", span=silences.parse_span(words[1].lower()))
        except silences.SilenceError:
            return Command("silence", problem="silence takes 1m to 24h, e.g. silence 2h")
    return Command(verb)


@dataclass(frozen=True, slots=True)
class Target:
    """Which of our messages a reply answers: its key, and how it was found."""

    key: str
    how: Literal["quote", "newest"]


def match(
    quote_id: int | None,
    quoted_key: str | None,
    newest: tuple[str, float] | None,
    now: float,
) -> Target | None:
    """`quoted_key`: the message stored under `quote_id` (None if none of ours); `newest`: our
    newest message about an incident and when it was sent. A quote that names none of ours
    matches nothing (the owner meant a specific message; guessing could ack the wrong one)."""
    if quote_id is not None:
        return None if quoted_key is None else Target(quoted_key, "quote")
    if newest is not None and now - newest[1] <= NEWEST_WITHIN:
        return Target(newest[0], "newest")
    return None


def confirmation(verb: Verb, incident: str | None, **fields: Any) -> str:
    """The short reply each command gets."""
    name = sanitize.one_line(incident or "", 120)
    if verb == "ack":
        return f"Acknowledged {name}: no more messages about it until it resolves and fires again or its severity rises."
    if verb == "silence":
        # A silence names the incident, not a firing: on an old message it still acts (as the
        # Silence button does), and says what it covers.
        since = (
            " It fired again (or got worse) since that message; the silence covers it as it is now."
            if fields.get("fired_again")
            else ""
        )
        return f"Silenced {name} until {fields['until']}.{since}"
    if verb == "unsilence":
        ended = int(fields.get("ended", 0))
        return f"Unsilenced {name}." if ended else f"{name} was not silenced."
    if verb == "details":
        lines = [f"{name}:"] + [str(line) for line in fields.get("lines", ())]
        text = "\n".join(lines) if len(lines) > 1 else f"{name}: no events stored."
        return text[:CONFIRMATION_LIMIT]
    if verb == "status":
        return sanitize.one_line(str(fields.get("line", "")), CONFIRMATION_LIMIT)
    problem = fields.get("problem")
    return f"{problem}. {HELP}" if problem else HELP


def firing_over(shown_version: int | None, status: str, version: int) -> bool:
    """Whether the firing an owner message showed (its incident's version when it went out)
    has ended at (`status`, `version`): the incident fired again or its severity rose, so an
    ack of that message would hold a firing the owner has not seen (the same test as an ack's
    end, `ack_current`; the fallback topic's Ack button asks it of its token's version). A
    message whose version is not known (sent before versions were kept) counts as current."""
    return shown_version is not None and not ack_current(shown_version, status, version)


def ack_refused(incident: str, how: Literal["quote", "newest"]) -> str:
    """The reply to an ack of a message whose firing is over (`firing_over`): nothing was
    acknowledged, and how to acknowledge the firing that is on now."""
    name = sanitize.one_line(incident, 120)
    answered = "the message you quoted" if how == "quote" else "my newest message"
    newer = "the newer message about it" if how == "quote" else "the newer message when it comes"
    return (
        f"{name} fired again (or got worse) since {answered}; nothing was acknowledged. "
        f"Reply ack to {newer} (swipe to quote it), or use the console."
    )


def ack_current(acked_version: int, status: str, version: int) -> bool:
    """Whether an ack given at incident version `acked_version` still holds at (`status`,
    `version`): the version changes exactly when the severity rises or the status flips
    (rules/incidents.merge), so it holds while unchanged or changed once by a resolve."""
    return version == acked_version or (version == acked_version + 1 and status == "resolved")
