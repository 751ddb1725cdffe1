"""Pure decoding of ntfy's `/json` stream: bytes in, typed frames out. No I/O, no clock.

`NdjsonDecoder.feed()` takes whatever chunks the socket produced (partial lines, several lines,
blank lines) and returns complete lines; `decode_line()` turns one line into a typed frame.
A line that is not a well-formed ntfy event never raises: it becomes `Junk` with a reason, and the
caller quarantines it. Validation uses exact types: a JSON `true` is not an integer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from ntfy_intake import sanitize

# Longer lines than this cannot be ntfy events (its JSON bodies are capped far below); keeping a
# bound stops a broken peer from growing our buffer without limit.
MAX_LINE_BYTES = 1 << 20

ID_RE = re.compile(r"[A-Za-z0-9]{12}")
TOPIC_RE = re.compile(r"[-_A-Za-z0-9]{1,64}")
DEFAULT_PRIORITY = 3


@dataclass(frozen=True, slots=True)
class Open:
    topic: str


@dataclass(frozen=True, slots=True)
class Keepalive:
    topic: str


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

    @property
    def cached(self) -> bool:
        return self.expires is not None

    @property
    def effective_priority(self) -> int:
        return DEFAULT_PRIORITY if self.priority is None else self.priority


@dataclass(frozen=True, slots=True)
class Junk:
    """A line that is not a usable event, kept verbatim for the quarantine."""

    raw: str
    reason: str
    event_id: str | None = None

    @property
    def raw_sha256(self) -> str:
        return hashlib.sha256(self.raw.encode("utf-8", "surrogatepass")).hexdigest()


Frame = Open | Keepalive | Message | Junk


class NdjsonDecoder:
    """Splits a byte stream into lines; keeps the unfinished tail for the next chunk."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._buffer = bytearray()
        self._max_line = max_line
        self._discarding = False  # inside an over-long line: drop bytes until its newline

    def feed(self, chunk: bytes) -> list[bytes | Junk]:
        """Return the complete lines in `chunk` (blank lines skipped); over-long lines as Junk."""
        out: list[bytes | Junk] = []
        self._buffer.extend(chunk)
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                if len(self._buffer) > self._max_line:
                    if not self._discarding:
                        out.append(_too_long(bytes(self._buffer[:256])))
                    self._discarding = True
                    self._buffer.clear()
                return out
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
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
        return Open(topic) if event == "open" else Keepalive(topic)
    if event != "message":
        return Junk(text, f"unsupported event type {event!r}", _maybe_id(obj))
    return validate_message(obj, text, topics)


def _maybe_id(obj: dict[str, Any]) -> str | None:
    value = obj.get("id")
    return value if isinstance(value, str) and ID_RE.fullmatch(value) else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_message(obj: dict[str, Any], text: str, topics: frozenset[str]) -> Message | Junk:
    """Check every field a message event may carry, with exact types."""
    event_id = obj.get("id")
    if not isinstance(event_id, str) or not ID_RE.fullmatch(event_id):
        return Junk(text, "'id' is not 12 characters of [A-Za-z0-9]")

    def junk(reason: str) -> Junk:
        return Junk(text, reason, event_id)

    time = obj.get("time")
    if not isinstance(time, int) or isinstance(time, bool) or time <= 0:
        return junk("'time' is not a positive integer")
    expires = obj.get("expires")
    if expires is not None and (not _is_int(expires) or expires <= 0):
        return junk("'expires' is not a positive integer")
    topic = obj.get("topic")
    if not isinstance(topic, str) or not TOPIC_RE.fullmatch(topic):
        return junk("'topic' is not a valid topic name")
    if topic not in topics:
        return junk(f"topic {topic!r} is not subscribed")
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
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
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
        raw_sha256=hashlib.sha256(canonical.encode()).hexdigest(),
    )
