"""What the owner's channels answer and what the owner sees: Signal (signal-cli-rest-api
`POST /v2/send`) and the ntfy fallback topic. Pure rules, no I/O: text preparation and redaction,
the classification of each answer (sent, partial, retry, fallback, dead), request headers and the
retry schedule. The sender (owner.py) is the loop around them."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import httpx

from ntfy_intake.rules import backoff, sanitize

TEXT_LIMIT = 2000  # characters
BYTE_LIMIT = 3900  # UTF-8 bytes: ntfy turns a body of 4096 bytes or more into an attachment (400)
RETRY_CAP = 300.0
CLAIM_BATCH = 16
DETAIL_LIMIT = 200
# Notices about possible or actual loss: priority 5 on the fallback topic.
LOSS_NOTICES = frozenset({"gap", "latch", "intake_dead"})
_ELLIPSIS = "…"
_EMPTY_TEXT = "(empty message)"
_NO_CHANNEL = (
    "no owner channel configured: set owner.signal_url (with signal_number and recipients) "
    "or owner.fallback_topic"
)

Channel = Literal["signal", "ntfy"]
LegResult = Literal["sent", "partial", "retry", "fallback", "dead"]


# -- pure helpers --------------------------------------------------------------------------------


def prepare_text(text: str, *, limit: int = TEXT_LIMIT, byte_limit: int = BYTE_LIMIT) -> str:
    """What reaches Signal or ntfy: controls, ANSI and bidi stripped (newlines kept, tabs become
    spaces), trailing whitespace dropped, cut to `limit` characters and `byte_limit` UTF-8 bytes
    (a cut text ends with "…"). Never empty."""
    clean = sanitize.strip_control(text, keep_newlines=True).replace("\t", " ")
    clean = "\n".join(line.rstrip() for line in clean.split("\n")).strip()
    if not clean:
        return _EMPTY_TEXT
    if len(clean) <= limit and len(clean.encode("utf-8")) <= byte_limit:
        return clean
    budget = byte_limit - len(_ELLIPSIS.encode("utf-8"))
    cut = clean[: limit - 1].encode("utf-8")[:budget].decode("utf-8", "ignore")
    return cut.rstrip() + _ELLIPSIS


_PHONE = re.compile(r"\+[0-9][0-9 ]{4,}[0-9]|[0-9]{7,}")
_GROUP = re.compile(r"group\.[A-Za-z0-9+/=_-]+")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def redact(text: str, known: Iterable[str] = ()) -> str:
    """One safe line for logs and the audit: no recipient numbers, group ids or uuids, no
    URLs, no controls, at most 200 characters. `known` (e.g. the configured numbers) are removed first."""
    for secret in sorted((k for k in known if k), key=len, reverse=True):
        text = text.replace(secret, "<recipient>")
    text = _URL.sub("<url>", text)
    text = _GROUP.sub("<group>", text)
    text = _UUID.sub("<uuid>", text)
    text = _PHONE.sub("<number>", text)
    return sanitize.one_line(text, DETAIL_LIMIT)


def _body_excerpt(body: bytes) -> str:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return str(parsed["error"])
    return body[:DETAIL_LIMIT].decode("utf-8", "replace")


def _identifiers(entry: object) -> set[str]:
    """Every recipient spelling a listed failure may use (stand-in, signal-cli json-rpc)."""
    if isinstance(entry, str):
        return {entry}
    if not isinstance(entry, dict):
        return set()
    found: set[str] = set()
    for name in ("recipient", "number", "uuid", "address", "username"):
        value = entry.get(name)
        if isinstance(value, str) and value:
            found.add(value)
    address = entry.get("recipientAddress")
    if isinstance(address, dict):
        found |= _identifiers(address)
    elif isinstance(address, str):
        found.add(address)
    for name in ("groupId", "group_id"):
        value = entry.get(name)
        if isinstance(value, str) and value:
            encoded = base64.b64encode(value.encode()).decode()
            found |= {value, f"group.{value}", f"group.{encoded}"}
    return found


def _listed_failures(body: bytes) -> list[object]:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return []
    if not isinstance(parsed, dict):
        return []
    entries: list[object] = []
    errors = parsed.get("errors")
    if isinstance(errors, list):
        entries.extend(errors)
    elif isinstance(errors, dict):
        entries.extend(errors)  # {"<recipient>": "<error>"}
    results = parsed.get("results")
    if isinstance(results, list):
        entries.extend(
            r
            for r in results
            if isinstance(r, dict) and isinstance(r.get("type"), str) and r["type"] != "SUCCESS"
        )
    return entries


def failed_recipients(body: bytes, requested: Sequence[str]) -> tuple[str, ...]:
    """The requested recipients a 2xx body lists as failed, in request order.

    A listed failure that names none of the requested recipients (a group member, an unknown
    shape) cannot be pinned down: it counts against the requested groups, or against every
    requested recipient when there is no group. Over-sending beats silence here."""
    failed: set[str] = set()
    unmapped = 0
    wanted = set(requested)
    for entry in _listed_failures(body):
        matched = _identifiers(entry) & wanted
        if matched:
            failed |= matched
        else:
            unmapped += 1
    if unmapped:
        groups = {r for r in requested if r.startswith("group.")}
        failed |= groups or wanted
    return tuple(r for r in requested if r in failed)


def sent_timestamp(body: bytes) -> int | None:
    """The Signal timestamp (ms) of a sent message from a 2xx `/v2/send` answer
    (`{"timestamp": "1700000000000"}`; some versions answer a number): what the owner's reply
    quotes as `quote.id`. None when the body carries none."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return None
    value = parsed.get("timestamp") if isinstance(parsed, dict) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        return int(value) or None
    return None


@dataclass(frozen=True, slots=True)
class SignalOutcome:
    kind: Literal["sent", "partial", "retry", "permanent"]
    detail: str
    status: int | None = None
    retry_after: float | None = None
    failed: tuple[str, ...] = ()  # partial / retry-after-201: the recipients still owed


def _retry_detail(status: int, retry_after: float | None) -> str:
    if retry_after is None:
        return f"HTTP {status}"
    return f"HTTP {status} (Retry-After {retry_after:g}s)"


def classify_signal(
    status: int | None,
    headers: httpx.Headers | None,
    body: bytes,
    error: str | None,
    now: float,
    requested: Sequence[str],
) -> SignalOutcome:
    """What a `POST /v2/send` answer means. `status` is None when no response arrived (timeout,
    connection error): ambiguous, the message may have gone out; it is retried anyway."""
    if status is None:
        return SignalOutcome("retry", error or "no response")
    if 200 <= status < 300:
        failed = failed_recipients(body, requested)
        if not failed:
            return SignalOutcome("sent", f"HTTP {status}", status)
        if len(failed) == len(requested):
            return SignalOutcome(
                "retry", f"HTTP {status} listing every recipient as failed", status, failed=failed
            )
        return SignalOutcome(
            "partial",
            f"HTTP {status} with {len(failed)} of {len(requested)} recipient(s) failed",
            status,
            failed=failed,
        )
    if status in (408, 429) or status >= 500:
        retry_after = backoff.parse_retry_after(
            headers.get("Retry-After") if headers else None, now
        )
        return SignalOutcome("retry", _retry_detail(status, retry_after), status, retry_after)
    return SignalOutcome("permanent", f"HTTP {status}: {_body_excerpt(body)}", status)


@dataclass(frozen=True, slots=True)
class NtfyOutcome:
    kind: Literal["sent", "retry", "permanent"]
    detail: str
    status: int | None = None
    retry_after: float | None = None


def classify_ntfy(
    status: int | None, headers: httpx.Headers | None, body: bytes, error: str | None, now: float
) -> NtfyOutcome:
    """What a publish to the fallback topic answered (ntfy: 200 with the event as JSON)."""
    if status is None:
        return NtfyOutcome("retry", error or "no response")
    if 200 <= status < 300:
        return NtfyOutcome("sent", f"HTTP {status}", status)
    if status in (408, 429) or status >= 500:
        retry_after = backoff.parse_retry_after(
            headers.get("Retry-After") if headers else None, now
        )
        return NtfyOutcome("retry", _retry_detail(status, retry_after), status, retry_after)
    return NtfyOutcome("permanent", f"HTTP {status}: {_body_excerpt(body)}", status)


_LABEL = re.compile(r"[^a-z0-9_-]")


def ntfy_headers(kind: str, topic: str, token: str | None) -> dict[str, str]:
    """Headers for a fallback publish: title names the notice kind (or "triage")."""
    label = "triage" if kind == "triage" else (_LABEL.sub("", topic.lower())[:40] or "notice")
    if kind == "triage":
        priority, emoji = "4", "robot"
    elif label in LOSS_NOTICES:
        priority, emoji = "5", "rotating_light"
    else:
        priority, emoji = "4", "warning"
    headers = {
        "Title": f"ntfy-intake: {label}",
        "Priority": priority,
        "Tags": f"{emoji},ntfy-intake,{label}",
        "Content-Type": "text/plain; charset=utf-8",
    }
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def retry_delay(
    attempt: int, retry_after: float | None, rng: Callable[[], float], *, base: float
) -> float:
    return backoff.delay(attempt - 1, base=base, cap=RETRY_CAP, rng=rng, retry_after=retry_after)


# -- the fallback topic's action buttons (DESIGN.md section 13) -----------------------------------

BUTTONS_PATH = "/v1/owner/buttons/"
# What a quoted value in ntfy's simple Actions form cannot hold: ntfy's parser ends it at the
# quote character, a backslash escapes the quote after it (a value ending in one would swallow
# its closing quote), and a header carries no control characters. Commas and semicolons are
# safe inside the quotes.
_UNSAFE_IN_ACTIONS = re.compile(r'["\\\x00-\x1f\x7f]')


def button_url(public_url: str, action: str) -> str:
    """Where a button POSTs: `http.public_url` (a proxy's path prefix kept) and the action."""
    return f"{public_url.rstrip('/')}{BUTTONS_PATH}{action}"


def actions_header(buttons: Sequence[tuple[str, str, str]]) -> str | None:
    """ntfy's `Actions` header (simple form) for (label, url, token) buttons: each an `http`
    action that POSTs the token as its body and clears the notification once it succeeded.
    None when a value cannot be written so that ntfy reads it back unchanged (a URL with a
    quote or a control character, non-ASCII): then the message goes without buttons."""
    parts = []
    for label, url, token in buttons:
        values = (label, url, token)
        if any(not v.isascii() or _UNSAFE_IN_ACTIONS.search(v) for v in values):
            return None
        parts.append(f'http, "{label}", "{url}", method=POST, body="{token}", clear=true')
    return "; ".join(parts) if parts else None
