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
import hashlib
import json
import re
from dataclasses import dataclass
from hashlib import sha256
from typing import Any, NamedTuple

from ntfy_intake.rules import sanitize
from ntfy_intake.wire import jsonsafe

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


class Message(NamedTuple):
    """A validated ntfy `message` event. (A NamedTuple, not a frozen dataclass: one is built
    per event of every replay, ~3x cheaper.)"""

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
        if not self._buffer and not self._discarding and chunk.endswith(b"\n"):
            return self._whole_lines(chunk)
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

    def _whole_lines(self, chunk: bytes) -> list[bytes | Junk]:
        """The common case (ntfy writes one chunk per frame): nothing pending and the chunk ends
        a line, so it splits without a copy through the buffer. Same result as the slow path."""
        out: list[bytes | Junk] = []
        for line in chunk[:-1].split(b"\n"):
            if len(line) > self._max_line:
                out.append(_too_long(line[:256]))
            elif line.strip():
                out.append(line)
        return out

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
    if type(obj) is not dict:
        return Junk(text, "not a JSON object")
    # Strict UTF-8 text holds no surrogate: only a `\uD800`-`\uDFFF` escape can put a lone one
    # in a decoded string, so without such an escape the walk over every string is skipped.
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None:
        clean = sanitize.valid_utf8(obj)  # the boundary rule; the raw below keeps the original
        if clean is not obj:
            frame = decode_object(clean, text, topics)
            if not isinstance(frame, Message):
                return frame
            canonical, raw_sha256 = _canonical(obj)
            return frame._replace(raw=canonical, raw_sha256=raw_sha256)
    return decode_object(obj, text, topics)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def decode_object(obj: dict[str, Any], text: str, topics: frozenset[str]) -> Frame:
    """One decoded JSON object (strings already valid UTF-8) as a typed frame."""
    event = obj.get("event")
    if event == "message":  # nearly every frame of a replay
        return validate_message(obj, text, topics)
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
# call, built once: the same bytes (the stored raw and its hash must never change), ~2 us less.
_CANONICAL = jsonsafe.compact_encoder(sort_keys=True)


def _canonical(obj: dict[str, Any]) -> tuple[str, str]:
    canonical = _CANONICAL(obj)
    return canonical, sha256(canonical.encode()).hexdigest()


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


def validate_message(obj: dict[str, Any], text: str, topics: frozenset[str]) -> Message | Junk:
    """Check every field a message event may carry, with exact types.

    Written out flat (no helper per field): it runs once per event of every replay. JSON gives
    only dict, list, str, int, float, bool and None, so `type(x) is int` is "an integer, not a
    boolean"."""
    event_id = obj.get("id")
    if type(event_id) is not str or _ID_MATCH(event_id) is None:
        return Junk(text, "'id' is not 12 characters of [A-Za-z0-9]")
    time = obj.get("time")
    if type(time) is not int or time <= 0:
        return Junk(text, "'time' is not a positive integer", event_id)
    expires = obj.get("expires")
    if expires is not None and (type(expires) is not int or expires <= 0):
        return Junk(text, "'expires' is not a positive integer", event_id)
    topic = obj.get("topic")
    if type(topic) is not str or _TOPIC_MATCH(topic) is None:
        return Junk(text, "'topic' is not a valid topic name", event_id)
    if topic not in topics:
        return Junk(text, f"topic {topic!r} is not subscribed", event_id)
    title = obj.get("title")
    if title is not None and type(title) is not str:
        return Junk(text, "'title' is not a string", event_id)
    message = obj.get("message", "")
    if type(message) is not str:
        return Junk(text, "'message' is not a string", event_id)
    priority = obj.get("priority")
    if priority is not None and (type(priority) is not int or not 1 <= priority <= 5):
        return Junk(text, "'priority' is not an integer from 1 to 5", event_id)
    tags = obj.get("tags", _NO_TAGS)
    if type(tags) is not list or (tags and not all(type(tag) is str for tag in tags)):
        return Junk(text, "'tags' is not a list of strings", event_id)
    sequence_id = obj.get("sequence_id")
    if sequence_id is not None and (
        type(sequence_id) is not str or _TOPIC_MATCH(sequence_id) is None
    ):
        return Junk(text, "'sequence_id' is not a valid sequence id", event_id)
    if obj.get("encoding") == "base64":
        message = decode_base64_body(message)
    canonical = _CANONICAL(obj)
    return Message(
        event_id,
        time,
        expires,
        topic,
        title,
        message,
        priority,
        tuple(tags),
        canonical,
        sha256(canonical.encode()).hexdigest(),
        sequence_id if sequence_id != event_id else None,
    )


_NO_TAGS: list[str] = []  # read only: a message without `tags`
_ID_MATCH = ID_RE.fullmatch
_TOPIC_MATCH = TOPIC_RE.fullmatch


def decode_base64_body(body: str) -> str:
    """A UnifiedPush body ntfy base64-encoded because it was not UTF-8. Decoded bytes that are
    still not UTF-8 get replacement characters; a body that is not base64 stays as it came."""
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return body
    return data.decode("utf-8", "replace")
