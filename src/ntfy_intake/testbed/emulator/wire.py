"""What goes over the wire: event objects, their Go-compatible JSON, and ntfy's error bodies.

Pure. Invariants owned here (ntfy-spec.md sections 1.3-1.5):
- an event serialises with the keys in ntfy's struct order and its omitempty rules: `id`, `time`,
  `event` and `topic` always; `sequence_id` (ntfy 2.16+) only when set and, except on WebSocket
  frames, different from `id`; `expires`, `title`, `message`, `priority` (0 left out, 3 kept),
  `tags`, `click`, `icon`, `actions`, `attachment`, `poll_id`, `content_type`, `encoding` only when
  set;
- JSON is compact like Go's encoder: `<`, `>`, `&`, U+2028 and U+2029 escaped, other non-ASCII raw;
- an error body is `{"code","http","error","link"}` (code left out when 0, link when empty) + newline;
- no string the emulator holds has a lone surrogate (`go_string`): Go's JSON decoder replaces a
  `\\ud800` escape with no partner by U+FFFD, and its encoder writes only valid UTF-8.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field, replace
from typing import Any

ID_ALPHABET = string.ascii_letters + string.digits
OPEN = "open"
KEEPALIVE = "keepalive"
MESSAGE = "message"
POLL_REQUEST = "poll_request"
MESSAGE_DELETE = "message_delete"
MESSAGE_CLEAR = "message_clear"
MESSAGE_EVENTS = frozenset({MESSAGE, MESSAGE_DELETE, MESSAGE_CLEAR})
EMPTY_MESSAGE_BODY = "triggered"
_GO_HTML_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_GO_ESCAPE_TABLE = str.maketrans(_GO_HTML_ESCAPES)
_SURROGATE = re.compile("[\ud800-\udfff]")


def go_string(text: str) -> str:
    """`text` as a Go string holds it: every lone surrogate (Python's json keeps a `\\ud800` escape
    with no partner as one; a pair is already one character) is U+FFFD, as Go's decoder makes it."""
    return _SURROGATE.sub("\ufffd", text)


def new_id() -> str:
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(12))


def go_json(value: Any) -> str:
    """Compact JSON as Go's json.Marshal writes it (no trailing newline).

    Safe to post-process: every `<>&` and line separator in the output sits inside a string, and
    Go's `\\b`/`\\f` and lowercase `\\u00xx` escapes match Python's.
    """
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate(_GO_ESCAPE_TABLE)


@dataclass(frozen=True)
class Event:
    """One ntfy event (the Go `message` struct), immutable."""

    id: str
    time: int
    event: str
    topic: str
    expires: int = 0
    title: str = ""
    message: str = ""
    priority: int = 0
    tags: tuple[str, ...] = ()
    click: str = ""
    icon: str = ""
    actions: tuple[dict[str, Any], ...] = ()
    attachment: tuple[tuple[str, str | int], ...] = field(default=())
    poll_id: str = ""
    content_type: str = ""
    encoding: str = ""
    sequence_id: str = ""

    def to_dict(self, *, websocket: bool = False) -> dict[str, Any]:
        """The JSON object in ntfy's key order, omitempty applied. ntfy (2.16+) leaves out a
        `sequence_id` equal to `id` on json/sse and in publish responses, not on /ws."""
        out: dict[str, Any] = {"id": self.id}
        if self.sequence_id and (websocket or self.sequence_id != self.id):
            out["sequence_id"] = self.sequence_id
        out["time"] = self.time
        if self.expires:
            out["expires"] = self.expires
        out["event"] = self.event
        out["topic"] = self.topic
        optional: list[tuple[str, Any]] = [
            ("title", self.title),
            ("message", self.message),
            ("priority", self.priority),
            ("tags", list(self.tags)),
            ("click", self.click),
            ("icon", self.icon),
            ("actions", [dict(action) for action in self.actions]),
            ("attachment", dict(self.attachment)),
            ("poll_id", self.poll_id),
            ("content_type", self.content_type),
            ("encoding", self.encoding),
        ]
        out.update((key, value) for key, value in optional if value)
        return out

    def line(self) -> bytes:
        """One NDJSON line, as json.Encoder.Encode writes it."""
        return (go_json(self.to_dict()) + "\n").encode("utf-8")

    def ws_frame(self) -> str:
        """One WebSocket text frame, as gorilla's WriteJSON writes it (JSON + newline)."""
        return go_json(self.to_dict(websocket=True)) + "\n"

    def with_expires(self, expires: int) -> Event:
        return replace(self, expires=expires)


def control_event(kind: str, topics: str, now: int) -> Event:
    """An open or keepalive event: fresh id, the raw comma-separated topic segment."""
    return Event(id=new_id(), time=now, event=kind, topic=topics)


@dataclass(eq=False)
class NtfyError(Exception):
    """An errHTTP: HTTP status, ntfy code, text and optional docs link (raised, or returned)."""

    code: int
    http: int
    error: str
    link: str = ""

    def __str__(self) -> str:
        return f"{self.http} {self.code}: {self.error}"

    def body(self) -> bytes:
        fields: dict[str, Any] = {}
        if self.code:
            fields["code"] = self.code
        fields["http"] = self.http
        fields["error"] = self.error
        if self.link:
            fields["link"] = self.link
        return (go_json(fields) + "\n").encode("utf-8")

    def wrap(self, text: str) -> NtfyError:
        """errHTTP.Wrap: append '; text' to the message."""
        return replace(self, error=f"{self.error}; {text}")


_LIMITS = "https://ntfy.sh/docs/publish/#limitations"
_AUTH = "https://ntfy.sh/docs/publish/#authentication"
BAD_REQUEST = NtfyError(40000, 400, "invalid request")
EMAIL_DISABLED = NtfyError(
    40001,
    400,
    "e-mail notifications are not enabled",
    "https://ntfy.sh/docs/config/#e-mail-notifications",
)
PRIORITY_INVALID = NtfyError(
    40007, 400, "invalid priority parameter", "https://ntfy.sh/docs/publish/#message-priority"
)
SINCE_INVALID = NtfyError(
    40008,
    400,
    "invalid since parameter",
    "https://ntfy.sh/docs/subscribe/api/#fetch-cached-messages",
)
TOPIC_INVALID = NtfyError(40009, 400, "invalid request: topic invalid")
TOPIC_DISALLOWED = NtfyError(40010, 400, "invalid request: topic name is not allowed")
MESSAGE_NOT_UTF8 = NtfyError(40011, 400, "invalid request: message must be UTF-8 encoded")
ATTACHMENT_URL_INVALID = NtfyError(
    40013,
    400,
    "invalid request: attachment URL is invalid",
    "https://ntfy.sh/docs/publish/#attachments",
)
ATTACHMENTS_DISALLOWED = NtfyError(
    40014,
    400,
    "invalid request: attachments not allowed",
    "https://ntfy.sh/docs/config/#attachments",
)
WEBSOCKET_UPGRADE_MISSING = NtfyError(
    40016,
    400,
    "invalid request: client not using the websocket protocol",
    "https://ntfy.sh/docs/subscribe/api/#websockets",
)
ICON_URL_INVALID = NtfyError(
    40021, 400, "invalid request: icon URL is invalid", "https://ntfy.sh/docs/publish/#icons"
)
JSON_INVALID = NtfyError(40024, 400, "invalid request: request body must be valid JSON")
PHONE_CALLS_DISABLED = NtfyError(
    40032, 400, "invalid request: calling is disabled", "https://ntfy.sh/docs/config/#phone-calls"
)
TEMPLATE_INVALID = NtfyError(
    40043,
    400,
    "invalid request: could not parse template",
    "https://ntfy.sh/docs/publish/#message-templating",
)
UNAUTHORIZED = NtfyError(40101, 401, "unauthorized", _AUTH)
FORBIDDEN = NtfyError(40301, 403, "forbidden", _AUTH)
NOT_FOUND = NtfyError(40401, 404, "page not found")
JSON_TOO_LARGE = NtfyError(41303, 413, "JSON body too large")
TOO_MANY_REQUESTS = NtfyError(42901, 429, "limit reached: too many requests", _LIMITS)
TOO_MANY_SUBSCRIPTIONS = NtfyError(
    42903, 429, "limit reached: too many active subscriptions", _LIMITS
)
TOO_MANY_AUTH_FAILURES = NtfyError(42909, 429, "limit reached: too many auth failures", _LIMITS)
INTERNAL_ERROR = NtfyError(50001, 500, "internal server error")
