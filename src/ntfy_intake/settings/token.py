"""How strong `http.token` must be (DESIGN.md section 10, turn 4): checked at start.

The token guards the agent feed, `/v1/notify` and the owner console, on a port that may face a
LAN. Failed logins are throttled (rules/login_throttle.py), which bounds guesses to a few an
hour; a token a person typed is still found in the first few guesses, so such a token is
refused, with the reason, never the value. The rule, in the order it is checked:

- at least `MIN_LENGTH` (20) characters;
- not only digits (a PIN, a date, a phone number);
- at least `MIN_DISTINCT` (8) different characters (`aaaa...`, `abab...`);
- not one short piece repeated (`abcdabcdabcd...`);
- not only lowercase words and separators (`change-me-to-a-long-random-string`, a phrase);
- not containing a well-known placeholder (`password`, `changeme`, `letmein`, `qwerty`, ...);
- not mostly a keyboard or alphabet run (`abcdefgh...`, `12345678...`).

What `ntfy-intake token` prints (`secrets.token_urlsafe(32)`, 43 characters, 256 bits) passes
every check: the words and placeholder checks are the only ones a random string can fail, and
the chance is below one in 10^7.
"""

from __future__ import annotations

import itertools
import re
import secrets

MIN_LENGTH = 20
MIN_DISTINCT = 8
PLACEHOLDERS = ("password", "passw0rd", "changeme", "change-me", "change_me", "letmein", "qwerty")
_WORDS = re.compile(r"[a-z]+(?:[-_. +:/][a-z]+)*")
COMMAND = "ntfy-intake token"


def generate() -> str:
    """A good token: 32 random bytes, URL-safe base64 (printable ASCII, no spaces)."""
    return secrets.token_urlsafe(32)


def print_one() -> int:
    """`ntfy-intake token`: one good token on stdout (nothing else: `> secrets/http_token`)."""
    print(generate())
    return 0


def weakness(token: str) -> str | None:
    """Why `token` is too weak to guard the HTTP surface, or None when it is not. The reason
    never quotes the token."""
    if len(token) < MIN_LENGTH:
        return f"shorter than {MIN_LENGTH} characters"
    if token.isdigit():
        return "only digits"
    distinct = len(set(token))
    if distinct < MIN_DISTINCT:
        return f"only {distinct} different characters"
    for size in range(1, len(token) // 2 + 1):
        if len(token) % size == 0 and token[:size] * (len(token) // size) == token:
            return "one short piece repeated"
    if _WORDS.fullmatch(token):
        return "only lowercase words, like a phrase a person typed"
    lowered = token.lower()
    if any(word in lowered for word in PLACEHOLDERS):
        return "a well-known placeholder word in it"
    steps = sum(1 for a, b in itertools.pairwise(lowered) if abs(ord(b) - ord(a)) == 1)
    if steps * 2 >= len(token):
        return "mostly a run like abcdef or 123456"
    return None


def refusal(reason: str) -> str:
    """The start-up failure's text (after the key's name)."""
    return f"too weak to guard the HTTP surface ({reason}); run `{COMMAND}` to print a good one"
