"""Passwords holding `%`, `@`, `:` and `/`, and the check that no message shows any part of
one (tests/unit/test_dsn.py, tests/integration/test_dsn_secrets.py)."""

from __future__ import annotations

import re
from urllib.parse import quote

from . import ports

# Distinct tokens around each separator, so a fragment is recognisable in any message.
PASSWORDS = ["S3%CRET", "Hq7@Zw9", "Kp4:Rt8", "Vb2/Nm5", "Ab1%Zd2@Ef3:Gh4/Jk5"]
# Written into a URI as they are (not percent-encoded), these are misread by libpq: a `%` not
# followed by two hex digits, an `@` or a `/` inside the password. (`:` alone is read whole.)
NAIVE_BROKEN = ["S3%CRET", "Hq7@Zw9", "Vb2/Nm5", "Ab1%Zd2@Ef3:Gh4/Jk5"]


def fragments(password: str) -> set[str]:
    """The password and every piece of it that a misreading parser could print."""
    pieces = {password, quote(password, safe=""), *re.split(r"[%@:/]", password)}
    for separator in "%@:/":
        head, _, tail = password.partition(separator)
        pieces |= {head, tail}
    return {piece for piece in pieces if len(piece) >= 3}


def assert_never_shown(text: str, password: str) -> None:
    for piece in fragments(password):
        assert piece not in text, f"{piece!r} (of the password) shown in: {text}"


def closed_port() -> int:
    return ports.free_port()
