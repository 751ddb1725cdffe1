"""Message heads: the fields every request carries, and the relay's everyday exchange without
h11 (its POST written, a plain reply's head read).

h11 costs about 50 us of CPU per POST (validating every request header, its state machine on
both sides), which was most of what the relay lost when its exchanges moved onto h11 (issue 20;
bench/bench_latency.py `--only post` measures both paths in one run). Here the two shapes the
relay meets every time are done by hand, with h11's own grammar (`h11._abnf`), and everything
else is left to h11:
- `RequestWriter.write` writes the bytes h11 would write for a POST whose header names carry no
  meaning to h11's state machine, or None, and h11 writes (or refuses) the request itself;
- `simple_head` reads a final HTTP/1.1 head with CRLF lines and one plain Content-Length, or
  None, and h11 reads it (told of the request first: `Connection.send`'s `replay`).
tests/unit/test_http_heads_match_h11.py holds both equal to h11: any request the relay can
make, any response split at any byte.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

import h11
import httpx
from h11._abnf import field_name, field_value, header_field, status_line

from ntfy_intake import __version__

USER_AGENT = f"ntfy-intake/{__version__}"

# h11's grammar, from h11 itself: a change there moves the fast path with it (and the test).
_FIELD_NAME = re.compile(field_name.encode("ascii"))
_FIELD_VALUE = re.compile(field_value.encode("ascii"))
_HEADER_FIELD = re.compile(header_field.encode("ascii"))
_STATUS_LINE = re.compile(status_line.encode("ascii"))
_LENGTH = re.compile(rb"[0-9]{1,20}")  # h11's Content-Length, one value, at most 20 digits

# Header names h11's state machine reads in a request (framing, Host, keep-alive, 100-continue,
# protocol switch): a request carrying one is written by h11.
_H11_SEMANTICS = frozenset(
    [b"host", b"content-length", b"transfer-encoding", b"connection", b"expect", b"upgrade"]
)


def default_fields(
    target: httpx.URL, headers: dict[str, str], body: bytes | None
) -> list[tuple[str, str]]:
    """The fields a request carries before the caller's `headers`, in the order sent:
    `Connection: close` for a GET stream (no body), a `Content-Length` for a POST; `headers`
    may override the User-Agent."""
    fields = [("Host", _host_header(target))]
    if "User-Agent" not in headers:
        fields.append(("User-Agent", USER_AGENT))
    fields += [("Accept", "*/*"), ("Accept-Encoding", "identity")]
    fields.append(("Connection", "close") if body is None else ("Content-Length", str(len(body))))
    if target.username or target.password:
        # What httpx does with credentials in the URL (ntfy.url may hold them): Basic auth.
        userpass = base64.b64encode(f"{target.username}:{target.password}".encode()).decode()
        fields.append(("Authorization", f"Basic {userpass}"))
    return fields


def host_name(target: httpx.URL) -> str:
    """The host as DNS and the Host header want it (an internationalized name in its IDNA form)."""
    return target.raw_host.decode("ascii")


def _host_header(target: httpx.URL) -> str:
    host = host_name(target)
    host = host if ":" not in host else f"[{host}]"
    return host if target.port is None else f"{host}:{target.port}"


_MAX_NAMES = 64


class RequestWriter:
    """POSTs to one target as h11 writes them: the request line and the fixed fields are built
    once, per request only the length and the caller's fields."""

    def __init__(self, target: httpx.URL) -> None:
        self.target = target
        # (head up to Content-Length, fields after it) with and without the caller's User-Agent;
        # None where h11 refuses the fixed part (then h11 refuses every request, as it should).
        self._templates = (self._template(False), self._template(True))
        # Header names seen before, encoded and judged (None: h11 must write the request).
        # The relay sends the same few names every time; the bound keeps a caller's odd
        # names from growing it.
        self._names: dict[str, bytes | None] = {}

    def write(self, headers: dict[str, str], body: bytes) -> bytes | None:
        """The request's bytes, or None when h11 must write or refuse it."""
        template = self._templates["User-Agent" in headers]  # (without, with) the caller's
        if template is None:
            return None
        head, tail = template
        parts = [head, b"Content-Length: %d\r\n" % len(body), tail]
        names = self._names
        for name, value in headers.items():
            raw_name = names[name] if name in names else self._judge(name)
            try:
                raw_value = value.encode("latin-1")
            except UnicodeEncodeError:
                return None
            if raw_name is None or _FIELD_VALUE.fullmatch(raw_value) is None:
                return None
            parts.append(b"%s: %s\r\n" % (raw_name, raw_value))
        parts.append(b"\r\n")
        parts.append(body)
        return b"".join(parts)

    def _judge(self, name: str) -> bytes | None:
        try:
            raw: bytes | None = name.encode("latin-1")
        except UnicodeEncodeError:
            raw = None
        if raw is not None and (raw.lower() in _H11_SEMANTICS or not _FIELD_NAME.fullmatch(raw)):
            raw = None
        if len(self._names) < _MAX_NAMES:
            self._names[name] = raw
        return raw

    def _template(self, user_agent_given: bool) -> tuple[bytes, bytes] | None:
        fields = default_fields(self.target, {"User-Agent": ""} if user_agent_given else {}, b"")
        try:
            encoded = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in fields]
            h11.Request(method="POST", target=self.target.raw_path, headers=encoded)
        except (UnicodeEncodeError, h11.LocalProtocolError):
            return None
        at = next(i for i, (name, _) in enumerate(encoded) if name == b"Content-Length")
        lines = [b"%s: %s\r\n" % field for field in encoded]
        head = b"POST %s HTTP/1.1\r\n" % self.target.raw_path + b"".join(lines[:at])
        return head, b"".join(lines[at + 1 :])


@dataclass(slots=True)
class SimpleHead:
    """A final response head as h11 would report it: status, fields (raw names, in order),
    the body's length, and whether the connection may carry another request."""

    status_code: int
    fields: list[tuple[bytes, bytes]]
    length: int
    keep_alive: bool


def simple_head(head: bytes) -> SimpleHead | None:
    """`head` (up to and with its blank line) when it is an HTTP/1.1 final response with CRLF
    lines, no folding, one Content-Length of digits and no Transfer-Encoding; else None."""
    if not head.endswith(b"\r\n\r\n"):
        return None
    # With every line matched below no bare LF is left (neither grammar takes one), so these
    # are the lines h11 would split.
    lines = head[:-4].split(b"\r\n")
    status = _STATUS_LINE.fullmatch(lines[0])
    if status is None or status["http_version"] != b"1.1":
        return None
    code = int(status["status_code"])
    if code < 200 or code in (204, 304):  # informational, or a body h11 frames as empty
        return None
    fields: list[tuple[bytes, bytes]] = []
    length: int | None = None
    keep_alive = True
    for line in lines[1:]:
        match = _HEADER_FIELD.fullmatch(line)
        if match is None:  # folded, malformed: h11 says how
            return None
        name, value = match.group("field_name", "field_value")
        lower = name.lower()
        if lower == b"content-length":
            if length is not None or _LENGTH.fullmatch(value) is None:
                return None
            length = int(value)
        elif lower == b"transfer-encoding":
            return None
        elif lower == b"connection" and b"close" in [v.strip() for v in value.lower().split(b",")]:
            keep_alive = False
        fields.append((name, value))
    if length is None:  # read to EOF: h11's
        return None
    return SimpleHead(code, fields, length, keep_alive)
