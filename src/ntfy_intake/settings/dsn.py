"""A PostgreSQL DSN read the way libpq reads it, and its password kept out of every message
(DESIGN.md section 11).

libpq's own parser (`psycopg.conninfo.conninfo_to_dict`: PQconninfoParse) reads both forms, a
URI and `key=value` words, so what the daemon shows and what it connects with are one reading.
On top of what libpq refuses, this module refuses what libpq reads *differently* from what the
writer meant, and would only fail later, at connect, naming a piece of the password:
- an `@` in a URI other than the one that ends the user and password (an unencoded `@` or `/`
  in a password: libpq takes what follows it for the host, the port or the database);
- a port that is not a number from 1 to 65535 (libpq checks it only at connect, quoting it).

No message here holds any text of the DSN: libpq's parse errors quote the text they stumbled on
(`invalid percent-encoded token: "S3%CRET"`), so the quoted parts are cut out and libpq's words
kept. `redact` removes the password in every form libpq or psycopg could print it.

psycopg is imported only when a DSN is read (SQLite installs do without it).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from urllib.parse import quote, unquote

from ntfy_intake.errors import StartupError

SCHEMES = ("postgresql://", "postgres://")
MASK = "***"
# How to write what libpq would misread (the hint every refusal of a URI ends with).
ENCODE_HINT = (
    "percent-encode a %, @, / or : in the user name or password (%25, %40, %2F, %3A),"
    " or use the key=value form with the password in single quotes"
)
# libpq's parse messages quote the text they stumbled on ("%s"), and that text may hold a `"`
# of the password: so no quote is taken for the end of a quoted part. These message openings
# hold a quote of libpq's own; after them, everything from the first `"` to the last is the
# DSN's (libpq's words never follow its last quoted text with a quote).
_LIBPQ_OPENINGS = (
    'missing "=" after ',
    'extra key/value separator "=" in URI query parameter: ',
    'missing key/value separator "=" in URI query parameter: ',
    'end of string reached when looking for matching "]" in IPv6 host address in URI: ',
)
_KEYWORDS_FORM = re.compile(r"\s*[A-Za-z_]+\s*=")


class DsnError(ValueError):
    """Why a DSN is refused, in words that hold no part of it."""


def looks_like_dsn(text: str) -> bool:
    """libpq's own test (`recognized_connection_string`): a URI, or `key=value` words."""
    return text.startswith(SCHEMES) or _KEYWORDS_FORM.match(text) is not None


def check(text: str) -> dict[str, str]:
    """The DSN's parameters as libpq reads them; DsnError when libpq refuses it or would read
    it differently from what was meant (module doc)."""
    if not looks_like_dsn(text):
        raise DsnError(
            "expected a PostgreSQL URI like postgresql://user@host/db, or key=value words like"
            " host=db.lan dbname=intake (value not shown)"
        )
    params = parse(text)
    if text.startswith(SCHEMES) and _stray_at(text):
        raise DsnError(
            "an @ after the host part, which libpq does not read as the end of the password"
            f" (an @ in the database name is written %40): {ENCODE_HINT}"
        )
    for port in params.get("port", "").split(","):
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            hint = f": {ENCODE_HINT}" if text.startswith(SCHEMES) else ""
            raise DsnError(f"a port that is not a number from 1 to 65535 (not shown){hint}")
    return dict(params)  # a copy: `parse` is cached


@functools.lru_cache(maxsize=16)
def parse(text: str) -> dict[str, str]:
    """libpq's reading of `text` (cached: the DSN is read once per message shown)."""
    try:
        import psycopg.conninfo  # noqa: PLC0415 - only a PostgreSQL install has it
    except ImportError:
        raise DsnError("PostgreSQL needs psycopg: install ntfy-intake[postgres]") from None
    try:
        return {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(text).items()}
    except psycopg.Error as exc:
        raise DsnError(_libpq_words(str(exc), uri=text.startswith(SCHEMES))) from None


def _libpq_words(message: str, *, uri: bool) -> str:
    """libpq's parse error with every text it quotes from the DSN cut out: its opening words
    kept, then all from the first `"` to the last (or to the end, when only one) replaced."""
    first = message.strip().splitlines()[0] if message.strip() else "cannot be parsed"
    opening = next((o for o in _LIBPQ_OPENINGS if first.startswith(o)), "")
    rest = first[len(opening) :]
    if '"' in rest:
        start, end = rest.index('"'), rest.rindex('"')
        tail = rest[end + 1 :] if end > start else ""
        rest = f"{rest[:start]}(not shown){tail}"
    words = (opening + rest).replace(": (not shown)", " (not shown)")
    if uri or "percent" in words:
        return f"libpq: {words}; {ENCODE_HINT}"
    return f"libpq: {words} (a value holding spaces or quotes is written 'in single quotes')"


def _stray_at(text: str) -> bool:
    """An `@` in the URI that libpq does not take as the end of the user and password: libpq
    looks for that `@` before the first `/` after the scheme (a `?` does not stop it); any
    other `@` before the query is where an unencoded `@` or `/` in the password was."""
    rest = text.split("://", 1)[1]
    credentials = re.match(r"[^@/]*@", rest)
    after = rest[credentials.end() :] if credentials else rest
    return "@" in after.split("?", 1)[0]


@functools.lru_cache(maxsize=16)
def secrets(text: str) -> tuple[str, ...]:
    """Every form the password of `text` could be printed in, longest first: as libpq reads it,
    percent-encoded and decoded; and when libpq refuses or misreads the DSN, the password as
    written, each piece of it around an `@`, `:` or `/` (where libpq cut it), and their
    forms."""
    found: set[str] = set()
    try:
        password: str | None = parse(text).get("password")
        misread = text.startswith(SCHEMES) and _stray_at(text)
    except DsnError:
        password, misread = None, True
    if password:
        found.add(password)
    if misread:
        for meant in _written_passwords(text):
            found.add(meant)
            found.update(piece for piece in re.split(r"[@:/]", meant) if len(piece) > 1)
            for separator in "@:/":
                found.update(part for part in meant.split(separator, 1) if len(part) > 1)
    forms: set[str] = set()
    for secret in found:
        forms |= {secret, quote(secret, safe=""), quote(secret), unquote(secret)}
    return tuple(sorted((form for form in forms if form), key=len, reverse=True))


def _written_passwords(text: str) -> set[str]:
    """The password as written, where libpq cannot say: in a URI, what lies between the
    user's `:` and the last `@` (before the query, and, as a `?` may be in the password,
    before the end); in the key=value form, the `password=` value as written."""
    if not text.startswith(SCHEMES):
        found = re.search(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)", text)
        return {found.group(1).strip("'")} if found else set()
    rest = text.split("://", 1)[1]
    written: set[str] = set()
    for scope in (rest.split("?", 1)[0], rest):
        _user, colon, password = scope.rpartition("@")[0].partition(":")
        if colon and password:
            written.add(password)
    return written


def redact(message: str, text: str) -> str:
    """`message` with the password of the DSN `text` removed in every form (`secrets`)."""
    for secret in secrets(text):
        message = message.replace(secret, MASK)
    return message


def redact_exception(exc: BaseException, text: str) -> BaseException:
    """`exc`, its causes and contexts with the password of `text` cut out of their messages,
    in place: the same exception, so its class and SQLSTATE still classify it."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        seen.args = tuple(redact(a, text) if isinstance(a, str) else a for a in seen.args)
        seen = seen.__cause__ or seen.__context__
    return exc


def checked(text: str) -> dict[str, str]:
    """`check` for the driver: a DSN that did not come through config load (`store copy
    --to`, a drill) is StartupError (exit 2) before libpq can misread it."""
    try:
        return check(text)
    except DsnError as exc:
        raise StartupError(f"PostgreSQL DSN: {exc}") from None


@contextlib.contextmanager
def redacting(text: str, errors: type[BaseException]) -> Iterator[None]:
    """Around the driver's connect: its `errors` redacted at the source (`redact_exception`).
    libpq and psycopg quote the host, port, database and options they failed on, and where a
    password was misread into one of them that is a piece of it. Statements on a live
    connection need none: the server's words never hold the password."""
    try:
        yield
    except errors as exc:
        redact_exception(exc, text)
        raise


@functools.lru_cache(maxsize=16)
def describe(text: str) -> str:
    """Where the DSN points, without its password: postgresql://user@host:port/database."""
    try:
        params = check(text)
    except DsnError:
        return "postgresql://(malformed DSN, not shown)"
    user = redact(params["user"], text) + "@" if params.get("user") else ""
    hosts = (params.get("host") or params.get("hostaddr") or "localhost").split(",")
    ports = (params.get("port") or "").split(",")
    ports = ports * len(hosts) if len(ports) == 1 else ports  # one port serves every host
    where = ",".join(
        redact(f"[{name}]" if ":" in name else name, text) + (f":{port}" if port else "")
        for name, port in zip(hosts, ports, strict=False)
    )
    # Each part redacted on its own: a short password never masks the scheme or the slashes.
    return f"postgresql://{user}{where}/{redact(database(text), text)}"


def host(text: str) -> str:
    try:
        params = check(text)
    except DsnError:
        return "(malformed DSN)"
    return redact(params.get("host") or params.get("hostaddr") or "localhost", text)


def database(text: str) -> str:
    try:
        params = check(text)
    except DsnError:
        return "(malformed DSN)"
    return redact(params.get("dbname") or params.get("user") or "postgres", text)
