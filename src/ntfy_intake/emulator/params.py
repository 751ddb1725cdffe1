"""Request parameters read the way ntfy reads them (`readParam` and friends, server/util.go).

Pure. Invariants owned here:
- a parameter is looked up under several names: every header name first (case-insensitive,
  RFC 2047-decoded, trimmed, first non-empty wins), then every query key (exact lowercase match);
- a query value that is present but blank ends the search (Go checks before trimming);
- the RFC 9218 form of the `Priority` header (`u=3, i`) is ignored;
- booleans are true only for 1/yes/true (case-insensitive); priorities are 1-5 or their names;
- subscribe filters (`id`, `message`, `title`, `priority`, `tags`) apply to `message` events (and
  ntfy 2.16+'s `message_delete`/`message_clear`) only.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

# Go's unicode.IsSpace, which strings.TrimSpace uses.
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_PRIORITY_HEADER_RFC9218 = re.compile(r"u=\d,\s*(i|\d)|u=\d", re.ASCII)
_ENCODED_WORD = re.compile(r"=\?([^?]*)\?([bBqQ])\?(.*?)\?=", re.DOTALL)
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_HEX_PAIR = re.compile(r"[0-9A-Fa-f]{2}")
_PRIORITIES = {
    "1": 1,
    "min": 1,
    "2": 2,
    "low": 2,
    "3": 3,
    "default": 3,
    "4": 4,
    "high": 4,
    "5": 5,
    "max": 5,
    "urgent": 5,
}


def go_trim(value: str) -> str:
    """strings.TrimSpace."""
    return value.strip(GO_SPACE)


def to_bool(value: str) -> bool:
    return value.lower() in ("1", "yes", "true")


def parse_priority(value: str) -> int:
    """util.ParsePriority: "" is 0 (not set); an unknown value raises ValueError."""
    text = go_trim(value.lower())
    if text == "":
        return 0
    if text not in _PRIORITIES:
        raise ValueError(f"invalid priority {value!r}")
    return _PRIORITIES[text]


def split_no_empty(value: str, sep: str = ",") -> list[str]:
    return [part for part in value.split(sep) if part != ""]


def parse_query_string(raw: bytes) -> dict[str, str]:
    """First value per key, like Go's url.ParseQuery + Get (pairs with ';' or bad escapes dropped)."""
    values: dict[str, str] = {}
    for part in raw.decode("latin-1").split("&"):
        if part == "" or ";" in part:
            continue
        key, _, value = part.partition("=")
        if _BAD_ESCAPE.search(key) or _BAD_ESCAPE.search(value):
            continue
        decoded_key = _unescape(key)
        values.setdefault(decoded_key, _unescape(value))
    return values


def _unescape(text: str) -> str:
    return unquote_to_bytes(text.replace("+", " ")).decode("utf-8", "replace")


def decode_mime_header(value: str) -> str:
    """RFC 2047 encoded words, like Go's mime.WordDecoder.DecodeHeader.

    Whitespace between two adjacent encoded words is dropped; a malformed word is kept verbatim;
    a charset other than utf-8, iso-8859-1 or us-ascii raises ValueError (Go errors out too).
    """
    out: list[str] = []
    position = 0
    previous_was_word = False
    for match in _ENCODED_WORD.finditer(value):
        between = value[position : match.start()]
        try:
            decoded = _decode_word(match.group(1), match.group(2), match.group(3))
        except (ValueError, binascii.Error):
            out.append(value[position : match.end()])
            position = match.end()
            previous_was_word = False
            continue
        if not previous_was_word or between.strip(" \t\r\n"):
            out.append(between)
        out.append(decoded)
        position = match.end()
        previous_was_word = True
    out.append(value[position:])
    return "".join(out)


def _decode_word(charset: str, encoding: str, text: str) -> str:
    raw = base64.b64decode(text, validate=True) if encoding in "bB" else _q_decode(text)
    name = charset.lower()
    if name == "utf-8":
        return raw.decode("utf-8", "replace")
    if name == "iso-8859-1":
        return raw.decode("latin-1")
    if name == "us-ascii":
        return "".join(chr(b) if b < 0x80 else "\ufffd" for b in raw)
    raise LookupError(f"unhandled charset {charset!r}")


def _q_decode(text: str) -> bytes:
    out = bytearray()
    index = 0
    while index < len(text):
        char = text[index]
        if char == "_":
            out.append(0x20)
        elif char == "=":
            pair = text[index + 1 : index + 3]
            if _HEX_PAIR.fullmatch(pair) is None:
                raise ValueError("bad escape in Q encoding")
            out.append(int(pair, 16))
            index += 2
        elif " " <= char <= "~" or char in "\n\r\t":
            out.append(ord(char))
        else:
            raise ValueError("invalid character in Q encoding")
        index += 1
    return bytes(out)


class Params:
    """The headers and query of one request, read with ntfy's precedence rules."""

    def __init__(self, headers: Mapping[str, str], query: Mapping[str, str]) -> None:
        self._headers = {name.lower(): value for name, value in headers.items()}
        self._query = dict(query)

    @classmethod
    def from_asgi(cls, raw_headers: Iterable[Sequence[bytes]], query_string: bytes) -> Params:
        headers: dict[str, str] = {}
        for name, value in raw_headers:
            headers.setdefault(name.decode("latin-1").lower(), value.decode("utf-8", "replace"))
        return cls(headers, parse_query_string(query_string))

    def header(self, name: str) -> str:
        """The raw first value of a header ('' when absent)."""
        return self._headers.get(name.lower(), "")

    def has_header(self, name: str) -> bool:
        return name.lower() in self._headers

    def query(self, name: str) -> str | None:
        return self._query.get(name)

    def query_items(self) -> dict[str, str]:
        return dict(self._query)

    def get(self, *names: str) -> str:
        """readParam: headers first, then lowercase query keys."""
        value = self.header_param(*names)
        return value if value != "" else self.query_param(*names)

    def header_param(self, *names: str) -> str:
        for name in names:
            raw = self.header(name)
            try:
                decoded = decode_mime_header(raw)
            except (ValueError, LookupError):
                decoded = raw
            if name.lower() == "priority" and _PRIORITY_HEADER_RFC9218.fullmatch(go_trim(decoded)):
                decoded = ""
            value = go_trim(decoded)
            if value != "":
                return value
        return ""

    def query_param(self, *names: str) -> str:
        for name in names:
            value = self._query.get(name.lower(), "")
            if value != "":
                return go_trim(value)
        return ""

    def get_bool(self, default: bool, *names: str) -> bool:
        value = self.get(*names).lower()
        return default if value == "" else to_bool(value)

    def get_list(self, *names: str) -> list[str]:
        """readCommaSeparatedParam: split on ',', drop empty parts, trim each."""
        value = self.get(*names)
        return [go_trim(part) for part in split_no_empty(value)] if value else []

    def with_headers(self, overrides: Mapping[str, str]) -> Params:
        """A copy with some headers replaced (how ntfy's JSON publish rewrites the request)."""
        return Params({**self._headers, **overrides}, self._query)


@dataclass(frozen=True)
class QueryFilter:
    """parseQueryFilters / Pass: exact matches; priority matches any, tags must all be present."""

    id: str = ""
    message: str = ""
    title: str = ""
    tags: tuple[str, ...] = ()
    priorities: tuple[int, ...] = ()

    def passes(self, event: Mapping[str, object]) -> bool:
        if event.get("event") not in ("message", "message_delete", "message_clear"):
            return True
        if self.id and event.get("id") != self.id:
            return False
        if self.message and event.get("message", "") != self.message:
            return False
        if self.title and event.get("title", "") != self.title:
            return False
        priority = event.get("priority", 0) or 3
        if self.priorities and priority not in self.priorities:
            return False
        tags = event.get("tags", [])
        assert isinstance(tags, list)
        return all(tag in tags for tag in self.tags)

    def describe(self) -> dict[str, object]:
        fields = {
            "id": self.id,
            "message": self.message,
            "title": self.title,
            "tags": list(self.tags),
            "priority": list(self.priorities),
        }
        return {key: value for key, value in fields.items() if value}


def parse_query_filters(params: Params) -> QueryFilter:
    """Raises ValueError on a bad priority (HTTP 400, code 40007)."""
    priorities = tuple(
        parse_priority(p) for p in split_no_empty(params.get("x-priority", "priority", "prio", "p"))
    )
    return QueryFilter(
        id=params.get("x-id", "id"),
        message=params.get("x-message", "message", "m"),
        title=params.get("x-title", "title", "t"),
        tags=tuple(split_no_empty(params.get("x-tags", "tags", "tag", "ta"))),
        priorities=priorities,
    )
