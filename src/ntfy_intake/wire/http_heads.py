"""Request heads: the fields every request of the daemon carries (the stream's GET, the relay's
POSTs), in the order sent, and the host as DNS and the Host field want it. h11 writes them
(`http_connection.request_bytes`)."""

from __future__ import annotations

import base64

import httpx

from ntfy_intake import __version__

USER_AGENT = f"ntfy-intake/{__version__}"


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
