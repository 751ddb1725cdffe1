"""Pure decoding of ntfy's `/json` stream: bytes in, typed frames out. No I/O, no clock.

`NdjsonDecoder.feed()` takes whatever chunks the socket produced (partial lines, several lines,
blank lines) and returns complete lines; `decode_line()` turns one line into a typed frame.
A line that is not a well-formed ntfy event never raises: it becomes `Junk` with a reason, and the
caller quarantines it. Validation uses exact types: a JSON `true` is not an integer.

Event kinds (ntfy-spec.md 1.5): `message`; ntfy >= 2.16's `message_delete` and `message_clear`
(`DeviceAction`: they name an earlier message by `sequence_id`); any other kind that carries an
id is `Ignored` (recorded, never junk). An `encoding: base64` body is decoded here, so the
envelope and the incident key are read from the text; `raw` keeps the frame as it came.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from ntfy_intake import sanitize

# ntfy's largest configurable message is 5 MiB (`message-size-limit`, cmd/serve.go). JSON escaping
# can write one byte as six (`\u003c`), so a line up to six times that, plus the other fields, may
# be a real event. Longer lines cannot be: the bound stops a broken peer from growing our buffer
# without limit.
MAX_MESSAGE_BYTES = 5 << 20
MAX_LINE_BYTES = 6 * MAX_MESSAGE_BYTES + (64 << 10)
DEVICE_ACTIONS = ("message_delete", "message_clear")

ID_RE = re.compile(r"[A-Za-z0-9]{12}")
TOPIC_RE = re.compile(r"[-_A-Za-z0-9]{1,64}")
DEFAULT_PRIORITY = 3


@dataclass(frozen=True, slots=True)
class Open:
    topic: str
    time: int | None = None  # the server's clock when it opened the subscription


@dataclass(frozen=True, slots=True)
class Keepalive:
    topic: str
    time: int | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """A validated ntfy `message` event."""

    id: str
    time: int
    expires: int | None  # None: published with `Cache: no`, so it can never be a cursor
    topic: str
    title: str | None
    message: str
    priority: int | None
    tags: tuple[str, ...]
    raw: str  # the canonical JSON of the whole event, compared for duplicate vs conflict
    raw_sha256: str
    sequence_id: str | None = None  # ntfy >= 2.16: set (and != id) on an update of an earlier one

    @property
    def cached(self) -> bool:
        return self.expires is not None

    @property
    def effective_priority(self) -> int:
        return DEFAULT_PRIORITY if self.priority is None else self.priority

    @property
    def sequence(self) -> str:
        """The message sequence this one belongs to: its own id unless it updates another."""
        return self.sequence_id or self.id


@dataclass(frozen=True, slots=True)
class DeviceAction:
    """ntfy >= 2.16 `message_delete` / `message_clear`: a device removed or dismissed the
    message named by (topic, sequence_id). Information for the incident, never a resolution."""

    id: str
    kind: str  # "message_delete" | "message_clear"
    time: int
    expires: int | None
    topic: str
    sequence_id: str
    raw: str
    raw_sha256: str

    @property
    def cached(self) -> bool:
        return self.expires is not None


@dataclass(frozen=True, slots=True)
class Ignored:
    """An event kind this daemon does not know (or has no use for, e.g. `poll_request`): recorded
    once under its id with its kind, so a replay is a duplicate; never junk, never a crash."""

    id: str
    kind: str
    time: int | None
    expires: int | None
    topic: str
    raw: str
    raw_sha256: str

    @property
    def cached(self) -> bool:
        # Never a cursor: whether ntfy caches (and `since=<id>` finds) a kind we do not know is
        # unknown, and a wrong guess would cost a full replay on every resume.
        return False


@dataclass(frozen=True, slots=True)
class Junk:
    """A line that is not a usable event, kept verbatim for the quarantine."""

    raw: str
    reason: str
    event_id: str | None = None

    @property
    def raw_sha256(self) -> str:
        return hashlib.sha256(self.raw.encode("utf-8", "surrogatepass")).hexdigest()


Event = Message | DeviceAction | Ignored
Frame = Open | Keepalive | Message | DeviceAction | Ignored | Junk


class NdjsonDecoder:
    """Splits a byte stream into lines; keeps the unfinished tail for the next chunk."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._buffer = bytearray()
        self._max_line = max_line
        self._discarding = False  # inside an over-long line: drop bytes until its newline
        self._scanned = 0  # bytes of the buffer already known to hold no newline

    def feed(self, chunk: bytes) -> list[bytes | Junk]:
        """Return the complete lines in `chunk` (blank lines skipped); over-long lines as Junk."""
        out: list[bytes | Junk] = []
        self._buffer.extend(chunk)
        while True:
            # Search only the new bytes: a multi-megabyte line arrives in many small chunks.
            newline = self._buffer.find(b"\n", self._scanned)
            if newline < 0:
                self._scanned = len(self._buffer)
                if len(self._buffer) > self._max_line:
                    if not self._discarding:
                        out.append(_too_long(bytes(self._buffer[:256])))
                    self._discarding = True
                    self._buffer.clear()
                    self._scanned = 0
                return out
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            self._scanned = 0
            if self._discarding:
                self._discarding = False
                continue
            if len(line) > self._max_line:
                out.append(_too_long(line[:256]))
                continue
            if line.strip():
                out.append(line)

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)


def _too_long(prefix: bytes) -> Junk:
    return Junk(prefix.decode("utf-8", "replace") + "...", f"line longer than {MAX_LINE_BYTES} B")


def decode_line(line: bytes, topics: frozenset[str]) -> Frame:
    """Decode one line of the stream. `topics` are the subscribed topics."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return Junk(line.decode("utf-8", "replace"), "not UTF-8")
    try:
        obj: Any = json.loads(text)
    except (ValueError, RecursionError):
        return Junk(text, "not JSON")
    if not isinstance(obj, dict):
        return Junk(text, "not a JSON object")
    clean = sanitize.valid_utf8(obj)  # the boundary rule; the raw below keeps the original
    if clean is not obj:
        frame = decode_object(clean, text, topics)
        if not isinstance(frame, Message):
            return frame
        canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        raw_sha256 = hashlib.sha256(canonical.encode()).hexdigest()
        return dataclasses.replace(frame, raw=canonical, raw_sha256=raw_sha256)
    return decode_object(obj, text, topics)


def decode_object(obj: dict[str, Any], text: str, topics: frozenset[str]) -> Frame:
    """One decoded JSON object (strings already valid UTF-8) as a typed frame."""
    event = obj.get("event")
    if not isinstance(event, str):
        return Junk(text, "missing or non-string 'event'")
    if event in ("open", "keepalive"):
        topic = obj.get("topic")
        if not isinstance(topic, str):
            return Junk(text, f"{event} event without a string 'topic'")
        at = _positive(obj.get("time"))
        return Open(topic, at) if event == "open" else Keepalive(topic, at)
    if event == "message":
        return validate_message(obj, text, topics)
    if event in DEVICE_ACTIONS:
        return validate_device_action(obj, event, text, topics)
    return _ignored(obj, event, text)


# What json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True) builds on every
# call, built once: the same bytes (the stored raw and its hash must never change), ~1 us less.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _canonical(obj: dict[str, Any]) -> tuple[str, str]:
    canonical = _CANONICAL.encode(obj)
    return canonical, hashlib.sha256(canonical.encode()).hexdigest()


def _ignored(obj: dict[str, Any], event: str, text: str) -> Ignored | Junk:
    event_id = _maybe_id(obj)
    kind = event[:64]
    if event_id is None:
        return Junk(text, f"event kind {kind!r} without a 12-character id")
    time = obj.get("time")
    expires = obj.get("expires")
    topic = obj.get("topic")
    raw, sha = _canonical(obj)
    return Ignored(
        id=event_id,
        kind=kind,
        time=_positive(time),
        expires=_positive(expires),
        topic=topic[:64] if isinstance(topic, str) else "",
        raw=raw,
        raw_sha256=sha,
    )


def validate_device_action(
    obj: dict[str, Any], event: str, text: str, topics: frozenset[str]
) -> DeviceAction | Junk:
    event_id = obj.get("id")
    if not isinstance(event_id, str) or not ID_RE.fullmatch(event_id):
        return Junk(text, "'id' is not 12 characters of [A-Za-z0-9]")
    common = _common_fields(obj, text, topics, event_id)
    if isinstance(common, Junk):
        return common
    time, expires, topic = common
    sequence_id = obj.get("sequence_id")
    if not isinstance(sequence_id, str) or not TOPIC_RE.fullmatch(sequence_id):
        return Junk(text, f"{event} without a valid 'sequence_id'", event_id)
    raw, sha = _canonical(obj)
    return DeviceAction(event_id, event, time, expires, topic, sequence_id, raw, sha)


def _common_fields(
    obj: dict[str, Any], text: str, topics: frozenset[str], event_id: str
) -> tuple[int, int | None, str] | Junk:
    time = obj.get("time")
    if not isinstance(time, int) or isinstance(time, bool) or time <= 0:
        return Junk(text, "'time' is not a positive integer", event_id)
    expires = obj.get("expires")
    if expires is not None and (
        not isinstance(expires, int) or isinstance(expires, bool) or expires <= 0
    ):
        return Junk(text, "'expires' is not a positive integer", event_id)
    topic = obj.get("topic")
    if not isinstance(topic, str) or not TOPIC_RE.fullmatch(topic):
        return Junk(text, "'topic' is not a valid topic name", event_id)
    if topic not in topics:
        return Junk(text, f"topic {topic!r} is not subscribed", event_id)
    return time, expires, topic


def _maybe_id(obj: dict[str, Any]) -> str | None:
    value = obj.get("id")
    return value if isinstance(value, str) and ID_RE.fullmatch(value) else None


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_message(obj: dict[str, Any], text: str, topics: frozenset[str]) -> Message | Junk:
    """Check every field a message event may carry, with exact types."""
    event_id = obj.get("id")
    if not isinstance(event_id, str) or not ID_RE.fullmatch(event_id):
        return Junk(text, "'id' is not 12 characters of [A-Za-z0-9]")

    def junk(reason: str) -> Junk:
        return Junk(text, reason, event_id)

    common = _common_fields(obj, text, topics, event_id)
    if isinstance(common, Junk):
        return common
    time, expires, topic = common
    title = obj.get("title")
    if title is not None and not isinstance(title, str):
        return junk("'title' is not a string")
    message = obj.get("message", "")
    if not isinstance(message, str):
        return junk("'message' is not a string")
    priority = obj.get("priority")
    if priority is not None and (not _is_int(priority) or priority not in range(1, 6)):
        return junk("'priority' is not an integer from 1 to 5")
    tags = obj.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        return junk("'tags' is not a list of strings")
    sequence_id = obj.get("sequence_id")
    if sequence_id is not None and (
        not isinstance(sequence_id, str) or not TOPIC_RE.fullmatch(sequence_id)
    ):
        return junk("'sequence_id' is not a valid sequence id")
    if obj.get("encoding") == "base64":
        message = decode_base64_body(message)
    canonical, sha = _canonical(obj)
    return Message(
        id=event_id,
        time=time,
        expires=expires,
        topic=topic,
        title=title,
        message=message,
        priority=priority,
        tags=tuple(tags),
        raw=canonical,
        raw_sha256=sha,
        sequence_id=sequence_id if sequence_id != event_id else None,
    )


def decode_base64_body(body: str) -> str:
    """A UnifiedPush body ntfy base64-encoded because it was not UTF-8. Decoded bytes that are
    still not UTF-8 get replacement characters; a body that is not base64 stays as it came."""
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return body
    return data.decode("utf-8", "replace")
