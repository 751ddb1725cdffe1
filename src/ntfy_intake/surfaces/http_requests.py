"""What every endpoint of the HTTP surface shares: the JSON answer, the refusal (`Reject`, a
JSON error), the body read within its bound, and the bearer check."""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ntfy_intake.wire import jsonsafe


class Reject(Exception):
    """Raised inside a handler to answer with a JSON error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def json_response(status: int, body: object, headers: Mapping[str, str] | None = None) -> Response:
    # ensure_ascii: untrusted alert text travels escaped, so no raw control or bidi character
    # reaches a client that prints the body.
    content = json.dumps(body, ensure_ascii=True, allow_nan=False)
    return Response(content, status, headers, media_type="application/json")


def error(status: int, code: str, message: str | None = None, **headers: str) -> Response:
    body = {"error": code} if message is None else {"error": code, "message": message}
    return json_response(status, body, {k.replace("_", "-"): v for k, v in headers.items()})


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise Reject(413, "body_too_large", f"at most {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Reject(413, "body_too_large", f"at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def json_object(request: Request, limit: int) -> dict[str, Any]:
    raw = await read_body(request, limit)
    try:
        # strict: a lone surrogate is refused (400) rather than stored as something the client
        # did not send; deep nesting, NaN and out-of-range numbers are 400s too, never 500s.
        body = jsonsafe.loads(raw, strict=True)
    except jsonsafe.BadJson as exc:
        raise Reject(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Reject(400, "bad_json", "the body must be a JSON object")
    return body


# -- auth -----------------------------------------------------------------------------------------


def authorize(request: Request, token: str) -> Response | None:
    """None when the bearer token matches; else the 401/403 answer (never echoing anything)."""
    scheme, _, presented = request.headers.get("authorization", "").strip().partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        return error(
            401,
            "unauthorized",
            "send Authorization: Bearer <http.token>",
            WWW_Authenticate="Bearer",
        )
    if not hmac.compare_digest(presented.encode(), token.encode()):
        return error(403, "forbidden", "the bearer token does not match")
    return None
