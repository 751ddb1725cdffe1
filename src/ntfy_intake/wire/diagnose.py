"""What to tell a person when the ntfy subscription fails, and what we subscribe to at start.

Pure: plain values in, one line out; no I/O. The line names the URL (without credentials), the
cause, ntfy's own error text when it sent one (its JSON error body: `code`, `error`), and a hint
at the setting to check. It is what `last error` in `status`, the log and the owner notice say,
so it must be readable without the source at hand.

Call sites (intake.py): `subscription()` once when the intake loop starts (log it at info
level); `http_failure()` where a subscribe answer is not 200 (the body is already read there);
`transport_failure()` where httpx raises a timeout or transport error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx

from ntfy_intake.rules.sanitize import one_line

BODY_CHARS = 200


def redact(url: str) -> str:
    """The URL without user:password@ (a token never belongs in a log line)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def subscription(base_url: str, topics: Sequence[str], *, token: bool, since: str) -> str:
    """`subscribing to <url> for topics a, b (token: yes) since <cursor>`."""
    stream = f"{redact(base_url).rstrip('/')}/{','.join(topics)}/json"
    return (
        f"subscribing to {stream} for {len(topics)} topic(s) {', '.join(topics)} "
        f"(token: {'yes' if token else 'no'}) since {since}"
    )


def ntfy_error(body: str | None) -> str | None:
    """ntfy's JSON error body as `40301 forbidden`, or the first line of any other body."""
    if not body or not body.strip():
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and ("error" in obj or "code" in obj):
        code = obj.get("code")
        text = one_line(str(obj.get("error", "")), BODY_CHARS)
        return f"{code} {text}".strip() if code is not None else text
    return one_line(body.strip().splitlines()[0], BODY_CHARS) or None


def http_failure(url: str, topics: Sequence[str], status: int, body: str | None) -> str:
    """One line for a subscribe answered with a status other than 200."""
    said = ntfy_error(body)
    text = f"HTTP {status} from {redact(url)}"
    if said:
        text += f" (ntfy says: {said})"
    return f"{text}: {_hint(status, said or '', topics, url)}"


def _hint(status: int, said: str, topics: Sequence[str], url: str) -> str:
    names = ", ".join(topics)
    if status == 401:
        return (
            "the server wants a valid token: check ntfy.token (or ntfy.token_file); "
            "ntfy blocks this address for a while after repeated failed logins"
        )
    if status == 403:
        return (
            f"the token or anonymous user may not read topic(s) {names}: check ntfy.topics "
            "and the server's access control (`ntfy access`)"
        )
    if status == 404:
        path = urlsplit(url).path
        prefix = path.rsplit("/", 2)[0] if path.count("/") >= 2 else ""
        where = f" (it has the path prefix {prefix!r})" if prefix else ""
        return (
            f"check ntfy.url{where}: it must be the server's base URL, e.g. "
            "https://ntfy.example.lan, with a path only if a reverse proxy serves ntfy under one"
        )
    if status == 400 and said.startswith("40009"):
        return f"the server refuses topic(s) {names} (not allowed, or too many): check ntfy.topics"
    if status == 400:
        return "the server rejected the request: check ntfy.url and ntfy.topics"
    if status == 429:
        return "rate limited by the server: retrying with backoff"
    if status in (502, 503, 504):
        return "the server or a proxy in front of it is unavailable: retrying with backoff"
    if status >= 500:
        return "server error: retrying with backoff"
    if 300 <= status < 400:
        return "redirected: set ntfy.url to the final address (https:// rather than http://?)"
    return "unexpected answer: check ntfy.url"


def transport_failure(url: str, exc: BaseException) -> str:
    """One line for a timeout or a connection that never got an HTTP answer."""
    target = redact(url)
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    detail = one_line(str(exc), BODY_CHARS) or type(exc).__name__
    lowered = detail.lower()
    if isinstance(exc, httpx.TimeoutException):
        return (
            f"{type(exc).__name__} talking to {target}: no answer in time; "
            f"is {host}:{port} reachable from here?"
        )
    if (
        "name or service not known" in lowered
        or "nodename nor servname" in lowered
        or ("temporary failure in name resolution" in lowered)
    ):
        return f"cannot resolve {host} ({detail}) for {target}: check ntfy.url and DNS"
    if "ssl" in lowered or "certificate" in lowered or "tls" in lowered:
        return (
            f"TLS failed talking to {target} ({detail}): check http:// vs https:// in ntfy.url "
            "and the server's certificate"
        )
    if "refused" in lowered:
        return (
            f"connection refused by {host}:{port} for {target}: is ntfy running there, "
            "and is ntfy.url right?"
        )
    return f"{type(exc).__name__} talking to {target} ({detail}): check ntfy.url and the network"
