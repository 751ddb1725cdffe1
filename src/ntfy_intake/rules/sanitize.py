"""Make untrusted text safe to show: strip terminal controls, quote it, build the feed's wake line.

Pure functions, no I/O. Every string that came from ntfy (or from any feed poster) passes through
here before it reaches a terminal, a log line, a Signal message or an agent's wake line.

What `strip_control` removes, in this order:
1. escape sequences, whole: CSI (``ESC [`` or 8-bit U+009B, parameters, intermediates, final byte);
   string commands OSC/DCS/SOS/PM/APC (``ESC ] P X ^ _`` or their 8-bit forms) terminated by BEL,
   ``ESC \\`` or U+009C; every other ``ESC`` + intermediates + final byte (charset, keypad, reset...).
   An *unterminated* string command loses only its introducer: the rest stays as plain text, so a
   stray ``ESC ]`` cannot swallow the remainder of an alert (and nothing left can act on a terminal);
2. every C0 control, DEL and every C1 control (U+0080-U+009F), including a lone ESC;
3. the Unicode bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069) and the bidi
   marks (U+200E, U+200F, U+061C), which can reorder what a reader sees ("Trojan Source");
4. lone surrogates, replaced by U+FFFD (they would crash a UTF-8 writer).

Line breaks and tabs: by default the output is one line. CR LF, CR, LF, tab, VT, FF, NEL, U+2028 and
U+2029 each become one space. With ``keep_newlines=True`` (multi-line sinks such as a Signal body)
every line break becomes ``\\n`` and tabs are kept; nothing else is.

`quote_untrusted` always uses single quotes and Python's escape rules (``\\\\``, ``\\'``,
``\\xNN``/``\\uNNNN`` for anything not printable, e.g. zero-width characters), so the result is a
valid Python literal: ``ast.literal_eval`` recovers exactly ``strip_control(text)``, and no content
can close the quote early and forge the text around it.
"""

from __future__ import annotations

import operator
import re
from typing import Any

__all__ = [
    "SUMMARY_LIMIT",
    "UNTRUSTED_LABEL",
    "one_line",
    "quote_untrusted",
    "strip_control",
    "valid_utf8",
    "wake_line",
]

UNTRUSTED_LABEL = "[untrusted]"
SUMMARY_LIMIT = 200
_NAME_LIMIT = 64

# String commands first (their body may contain bytes that look like other sequences), then CSI,
# then the remaining two-or-more character ESC sequences. The body class stops at ESC/BEL/ST, so
# each attempt scans at most to the next ESC: linear time on hostile input.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]"
)
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CRLF = re.compile(r"\r\n?")

_LINE_BREAKS = "\n\x0b\x0c\x85\u2028\u2029"
_BIDI = (
    "\u061c\u200e\u200f"
    + "".join(map(chr, range(0x202A, 0x202F)))
    + "".join(map(chr, range(0x2066, 0x206A)))
)
_CONTROLS = "".join(map(chr, range(0x20))) + "".join(map(chr, range(0x7F, 0xA0)))


def _table(*, keep_newlines: bool) -> dict[int, str | None]:
    table: dict[int, str | None] = {ord(c): None for c in _CONTROLS + _BIDI}
    if keep_newlines:
        table.update({ord(c): "\n" for c in _LINE_BREAKS})
        table[ord("\t")] = "\t"
    else:
        table.update({ord(c): " " for c in _LINE_BREAKS + "\t"})
    return table


_ONE_LINE = _table(keep_newlines=False)
_MULTI_LINE = _table(keep_newlines=True)


def strip_control(text: str, *, keep_newlines: bool = False) -> str:
    """Remove escape sequences, control characters and bidi controls (see the module docstring)."""
    text = _ESCAPE_SEQUENCE.sub("", text)
    text = _CRLF.sub("\n" if keep_newlines else " ", text)
    text = _SURROGATE.sub("\ufffd", text)
    return text.translate(_MULTI_LINE if keep_newlines else _ONE_LINE)


def one_line(text: str, limit: int = SUMMARY_LIMIT) -> str:
    """Strip controls, collapse all whitespace to single spaces, cut to `limit` characters.

    A cut text ends with "…", which counts towards the limit.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    flat = " ".join(strip_control(text).split())
    if len(flat) <= limit:
        return flat
    return flat[: limit - 1].rstrip() + "…"


def _escape(char: str) -> str:
    if char == "\\":
        return "\\\\"
    if char == "'":
        return "\\'"
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def quote_untrusted(text: str) -> str:
    """Single-quote `text` after stripping it, escaping so the quote cannot be closed by content."""
    return "'" + "".join(map(_escape, strip_control(text))) + "'"


def wake_line(channel: str, seq: int, sender: str, summary: str) -> str:
    """The doorbell's one-line notice, e.g. ``'triage'#12 from 'ntfy-intake': [untrusted] '…'``.

    Channel and sender are quoted and cut to 64 characters; the summary (free text from the alert)
    is flattened, cut to 200 characters, quoted, and follows the ``[untrusted]`` label. The seq is
    formatted as an integer, so it cannot carry text. No other content ever enters the line.
    """
    number = operator.index(seq)
    return (
        f"{quote_untrusted(one_line(channel, _NAME_LIMIT))}#{number}"
        f" from {quote_untrusted(one_line(sender, _NAME_LIMIT))}:"
        f" {UNTRUSTED_LABEL} {quote_untrusted(one_line(summary, SUMMARY_LIMIT))}"
    )


def valid_utf8(value: Any) -> Any:
    """`value` (a decoded JSON document) with every lone surrogate in its strings, keys included,
    replaced by U+FFFD, so that any UTF-8 writer (SQLite, a log, a socket) accepts it.

    The decode boundary's rule: a JSON ``\\ud83d`` escape with no partner is valid ASCII on the
    wire and a crash at the first write. Returns `value` itself when nothing needed replacing
    (the common case costs one scan). Iterative, so a deeply nested document cannot exhaust
    the stack.
    """
    if not _holds_surrogate(value):
        return value
    return _rebuild(value)


def _fix(text: str) -> str:
    return _SURROGATE.sub("\ufffd", text)


def _holds_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _rebuild(value: Any) -> Any:
    if isinstance(value, str):
        return _fix(value)
    if not isinstance(value, dict | list | tuple):
        return value
    root: Any = {} if isinstance(value, dict) else []
    # (source container, its copy): children are copied into their parent's copy in order.
    work: list[tuple[Any, Any]] = [(value, root)]
    while work:
        source, target = work.pop()
        pairs = source.items() if isinstance(source, dict) else enumerate(source)
        for key, child in pairs:
            if isinstance(child, str):
                copy: Any = _fix(child)
            elif isinstance(child, dict):
                copy = {}
                work.append((child, copy))
            elif isinstance(child, list | tuple):
                copy = []
                work.append((child, copy))
            else:
                copy = child
            if isinstance(target, dict):
                target[_fix(key) if isinstance(key, str) else key] = copy
            else:
                target.append(copy)
    return root
