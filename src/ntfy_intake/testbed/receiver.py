"""The reference triage receiver: what an agent's endpoint must do with a triage request.

Agent authors copy this. Invariants owned here:
- given a Standard Webhooks secret, an unsigned, forged or stale request (outside the timestamp
  tolerance) is refused with 401 before anything is parsed or stored, so nobody who merely knows
  a delivery key (every topic subscriber does) can claim it first; without a secret every request
  is accepted and `serve` warns at start;
- a delivery key's receipt and its effect (the decision) commit in one SQLite transaction
  (BEGIN IMMEDIATE), so a crash leaves both or neither;
- a request is answered only after that transaction committed (synchronous=FULL): a receipt
  answered 200 survives a kill -9 or a power cut. Requests that arrive together share one
  transaction and one fsync (group commit, `ReceiptWriter`), each in its own savepoint, so one
  request's failure stores nothing for it and takes nothing from the others;
- a repeat of a key with the same canonical body gets the *original* stored answer, byte for byte,
  with `Idempotent-Replayed: true`; nothing is decided again, only the repeat is counted;
- a repeat of a key with a different body is a 409 and changes nothing;
- a request that fails (injected fault, validation, `decide` raising) stores nothing, so the
  daemon's retry with the same key is a first delivery;
- state lives only in SQLite, so the receiver survives its own restart;
- ntfy text is untrusted data: it reaches a notify text only cleaned and repr-quoted, never as
  instructions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import queue
import re
import sqlite3
import sys
import threading
import time
import unicodedata
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ntfy_intake.store import db
from ntfy_intake.surfaces import serve as _serve
from ntfy_intake.wire import jsonsafe, signing

SCHEMA = "ntfy-intake.triage/1"
MAX_BODY_BYTES = 1 << 20
_KEY = re.compile(r"[\x21-\x7e]{1,200}")  # printable ASCII, no spaces

Decide = Callable[[dict[str, object]], dict[str, object] | None]

log = structlog.get_logger("ntfy_intake.testbed.receiver")

_MIGRATIONS: list[db.Migration] = [
    (
        "receiver_001_receipts",
        [
            "CREATE TABLE receipts ("
            " delivery_key TEXT PRIMARY KEY,"
            " body_sha256 TEXT NOT NULL,"
            " status INTEGER NOT NULL,"
            " response_json TEXT NOT NULL,"
            " received_at REAL NOT NULL,"
            " repeats INTEGER NOT NULL DEFAULT 0 CHECK (repeats >= 0),"
            " last_repeat_at REAL)"
        ],
    )
]

# -- untrusted text -------------------------------------------------------------------------------

_ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI ... final byte (colours, cursor moves)
    r"|(?:\x1b[P\]X^_]|[\x90\x9d\x98\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC/DCS/...
    r"|\x1b[@-Z\\-_]"  # two-byte escapes
)
_SPACE_LIKE = frozenset("\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\u2028\u2029")
_DROP = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def clean_text(value: object, *, limit: int = 200) -> str:
    """Untrusted text made safe for a terminal or a message: ANSI and control/format characters
    removed (line breaks become spaces), whitespace collapsed, cut to `limit` characters."""
    text = _ANSI.sub("", value if isinstance(value, str) else str(value))
    kept = (
        " " if ch in _SPACE_LIKE else ch
        for ch in text
        if ch in _SPACE_LIKE or unicodedata.category(ch) not in _DROP
    )
    text = " ".join("".join(kept).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def default_decide(body: dict[str, object]) -> dict[str, object] | None:
    """Notify the owner when a firing incident has severity >= 4, quoting ntfy text as data."""
    incident = body.get("incident")
    if not isinstance(incident, dict):
        return None
    severity = incident.get("severity")
    if type(severity) is not int or severity < 4 or incident.get("status") != "firing":
        return None
    listed = body.get("events")
    events = [e for e in listed if isinstance(e, dict)] if isinstance(listed, list) else []
    if not events:
        return {"text": f"[sev {severity}] incident {clean_text(incident.get('key'))!r}"}
    last = events[-1]
    topic = clean_text(last.get("topic", ""), limit=64)
    title, message = clean_text(last.get("title", "")), clean_text(last.get("message", ""))
    text = f"[sev {severity}] {topic}: {title!r} — {message!r}"
    if len(events) > 1:
        text += f" (+{len(events) - 1} more)"
    return {"text": text}


# -- faults (tests) -------------------------------------------------------------------------------


@dataclass
class ReceiverFaults:
    """Thread-safe fault plan, consumed one request at a time in the order given."""

    _lock: threading.Lock = field(init=False, default_factory=threading.Lock, repr=False)
    _injected: deque[tuple[int, float | None]] = field(init=False, default_factory=deque)
    _stalls: deque[float] = field(init=False, default_factory=deque)

    def fail_next(self, n: int = 1, status: int = 503, retry_after: float | None = None) -> None:
        """Answer the next `n` requests with `status` (and Retry-After), storing no receipt."""
        with self._lock:
            self._injected.extend([(status, retry_after)] * n)

    def reject_next(self, status: int = 400, *, n: int = 1) -> None:
        """Answer the next `n` requests with a permanent-looking `status`, storing no receipt."""
        self.fail_next(n, status)

    def commit_then_stall(self, seconds: float, *, n: int = 1) -> None:
        """For the next `n` answered requests: commit the receipt, then wait `seconds` before
        answering, so a client with a shorter timeout sees an ambiguous outcome."""
        with self._lock:
            self._stalls.extend([seconds] * n)

    def take_injected(self) -> tuple[int, float | None] | None:
        with self._lock:
            return self._injected.popleft() if self._injected else None

    def take_stall(self) -> float | None:
        with self._lock:
            return self._stalls.popleft() if self._stalls else None


# -- receipts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Receipt:
    key: str
    body_sha256: str
    status: int
    response: dict[str, object]
    repeats: int
    received_at: float


def body_sha256(body: object) -> str:
    """sha256 of the canonical JSON form: sorted keys, no spaces, ASCII escapes."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def receipts(db_path: Path) -> list[Receipt]:
    """Every stored receipt, oldest first; safe to call while the receiver runs."""
    if not Path(db_path).exists():
        return []
    conn = db.connect(db_path)
    try:
        rows = conn.execute("SELECT * FROM receipts ORDER BY received_at, delivery_key").fetchall()
    except sqlite3.OperationalError:  # no table yet
        return []
    finally:
        conn.close()
    return [
        Receipt(
            key=row["delivery_key"],
            body_sha256=row["body_sha256"],
            status=row["status"],
            response=json.loads(row["response_json"]),
            repeats=row["repeats"],
            received_at=row["received_at"],
        )
        for row in rows
    ]


@dataclass(frozen=True)
class _Answer:
    status: int
    content: bytes
    stored: bool  # the answer is a receipt (new or replayed), so a stall fault may apply
    replayed: bool = False


def _render(payload: object) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _error(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    content = _render({"error": code, "detail": detail})
    return Response(content, status, headers=headers, media_type="application/json")


def _settle(conn: db.Connection, key: str, body: dict[str, object], decide: Decide) -> _Answer:
    """One request's receipt, inside the caller's write transaction."""
    digest = body_sha256(body)
    row = conn.execute(
        "SELECT body_sha256, status, response_json FROM receipts WHERE delivery_key = ?",
        (key,),
    ).fetchone()
    if row is not None and row["body_sha256"] != digest:
        detail = (
            f"Idempotency-Key {key!r} was already used with a different body; "
            "a delivery key must always carry the same request"
        )
        return _Answer(409, _render({"error": "key_reused", "detail": detail}), False)
    if row is not None:
        conn.execute(
            "UPDATE receipts SET repeats = repeats + 1, last_repeat_at = ? WHERE delivery_key = ?",
            (time.time(), key),
        )
        return _Answer(row["status"], row["response_json"].encode(), True, True)
    # The effect: decide inside the transaction, so decision and receipt commit together.
    notify = decide(body)
    response: dict[str, object] = {"accepted": True, "delivery_key": key}
    if notify is not None:
        if not isinstance(notify.get("text"), str):
            raise TypeError("decide must return None or a dict with a str 'text'")
        response["notify"] = notify
    content = _render(response)
    conn.execute(
        "INSERT INTO receipts (delivery_key, body_sha256, status, response_json,"
        " received_at) VALUES (?, ?, 200, ?, ?)",
        (key, digest, content.decode(), time.time()),
    )
    return _Answer(200, content, True)


@dataclass
class _Job:
    key: str
    body: dict[str, object]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[_Answer]


class ReceiptWriter:
    """One SQLite connection in one thread, committing the receipts of the requests waiting for
    it in one transaction (group commit): under load many receipts share one fsync, and a lone
    request commits at once. Each future is resolved only after its group's COMMIT returned.
    A writer that cannot go on (the database cannot be opened) fails what waits for it, so those
    requests answer 500 and store nothing; the next request starts a new one."""

    MAX_GROUP = 64

    def __init__(self, db_path: Path, decide: Decide) -> None:
        self.db_path = db_path
        self.decide = decide
        self.groups = 0  # transactions committed (tests, benches)
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] | None = None  # the running writer's queue
        self._thread: threading.Thread | None = None

    async def settle(self, key: str, body: dict[str, object]) -> _Answer:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Answer] = loop.create_future()
        with self._lock:  # a job is queued only for a writer that will take it
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._run, args=(self._jobs,), name="receipt-writer", daemon=True
                )
                self._thread.start()
            self._jobs.put(_Job(key, body, loop, future))
        return await future

    def close(self) -> None:
        """Commit and answer what is queued, then stop the writer."""
        with self._lock:
            jobs, thread = self._jobs, self._thread
            self._jobs = self._thread = None
        if jobs is not None:
            jobs.put(None)
        if thread is not None:
            thread.join(10)

    def _run(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        try:
            conn = db.connect(self.db_path)
        except Exception as exc:  # noqa: BLE001 - answered as 500s, never a hang
            self._abandon(jobs, exc)
            return
        try:
            while True:
                first = jobs.get()
                if first is None:
                    return
                group, stopping = [first], False
                while len(group) < self.MAX_GROUP and not stopping:
                    try:
                        job = jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:
                        stopping = True
                    else:
                        group.append(job)
                for job, result in zip(group, self._commit(conn, group), strict=True):
                    _answer(job, result)
                if stopping:
                    return
        finally:
            conn.close()

    def _abandon(self, jobs: queue.SimpleQueue[_Job | None], exc: Exception) -> None:
        with self._lock:
            if self._jobs is jobs:
                self._jobs = self._thread = None
        while True:  # nothing is queued here any more: fail what is
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                _answer(job, exc)

    def _commit(self, conn: db.Connection, group: list[_Job]) -> list[_Answer | Exception]:
        results: list[_Answer | Exception] = []
        try:
            with db.write_txn(conn):
                for job in group:
                    conn.execute("SAVEPOINT receipt")
                    try:
                        results.append(_settle(conn, job.key, job.body, self.decide))
                    except Exception as exc:  # noqa: BLE001 - this request's 500, not the group's
                        conn.execute("ROLLBACK TO receipt")
                        results.append(exc)
                    conn.execute("RELEASE receipt")
            self.groups += 1
        except Exception as exc:  # noqa: BLE001 - the COMMIT failed: nothing of the group stored
            return [exc] * len(group)
        return results


def _answer(job: _Job, result: _Answer | Exception) -> None:
    with contextlib.suppress(RuntimeError):  # the request's event loop is closed: nobody waits
        job.loop.call_soon_threadsafe(_resolve, job.future, result)


def _resolve(future: asyncio.Future[_Answer], result: _Answer | Exception) -> None:
    if future.done():  # the request went away (client disconnected): its receipt stands
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)


def _validate(body: object, key: str) -> str | None:
    """Why the body is not a triage request for `key`, or None."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if body.get("schema") != SCHEMA:
        return f"schema must be {SCHEMA!r}, got {clean_text(body.get('schema'), limit=60)!r}"
    if not isinstance(body.get("delivery_key"), str):
        return "delivery_key must be a string"
    if body["delivery_key"] != key:
        return "the Idempotency-Key header and the body's delivery_key differ"
    if not isinstance(body.get("incident"), dict):
        return "incident must be an object"
    if not isinstance(body.get("events"), list):
        return "events must be a list"
    return None


def _refusal(
    request: Request, raw: bytes, key: str, secret: bytes | None, token: str | None, now: float
) -> str | None:
    """Why the request is not from the daemon (bad token or signature), or None."""
    if token is not None:
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            presented.strip().encode("utf-8", "replace"), token.encode()
        ):
            return "missing or wrong bearer token"
    if secret is None:
        return None
    if request.headers.get("webhook-id", key) != key:
        return "webhook-id differs from Idempotency-Key"
    return signing.verify(secret, request.headers, raw, now)


def create_app(
    db_path: Path,
    *,
    decide: Decide = default_decide,
    faults: ReceiverFaults | None = None,
    secret: bytes | None = None,
    token: str | None = None,
    tolerance: float = signing.DEFAULT_TOLERANCE,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The receiver as an ASGI app: `POST /triage` (and `POST /`), `GET /healthz`.

    With `secret` (the key bytes of a `whsec_` secret, `signing.parse_secret`) every triage
    request must carry a valid Standard Webhooks signature no older or newer than `tolerance`
    seconds by `clock`; with `token` it must carry `Authorization: Bearer <token>`.
    """
    conn = db.connect(db_path)
    try:
        db.migrate(conn, _MIGRATIONS)
    finally:
        conn.close()
    stopping = threading.Event()
    writer = ReceiptWriter(db_path, decide)

    async def triage(request: Request) -> Response:
        injected = faults.take_injected() if faults is not None else None
        if injected is not None:
            status, retry_after = injected
            headers = (
                {}
                if retry_after is None
                else {"Retry-After": _serve.retry_after_value(retry_after)}
            )
            return _error(status, "injected_fault", "fault injected by the test", headers)
        key = request.headers.get("idempotency-key", "").strip()
        if not key:
            return _error(400, "missing_idempotency_key", "send Idempotency-Key: <delivery_key>")
        if not _KEY.fullmatch(key):
            return _error(400, "bad_idempotency_key", "1-200 printable ASCII characters, no spaces")
        declared = request.headers.get("content-length", "0")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            return _error(413, "body_too_large", f"at most {MAX_BODY_BYTES} bytes")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return _error(413, "body_too_large", f"at most {MAX_BODY_BYTES} bytes")
        refused = _refusal(request, raw, key, secret, token, clock())
        if refused is not None:
            log.warning("receiver.refused", reason=refused)
            return _error(401, "unauthorized", refused)
        try:
            body = jsonsafe.loads(raw)  # strings valid UTF-8: a lone surrogate becomes U+FFFD
        except jsonsafe.BadJson as exc:
            return _error(400, "bad_json", f"the body is not acceptable JSON: {exc}")
        problem = _validate(body, key)
        if problem is not None:
            return _error(400, "bad_request", problem)
        assert isinstance(body, dict)  # _validate checked it
        try:
            answer = await writer.settle(key, body)
        except Exception:
            log.exception("receiver.settle_failed", delivery_key=key)
            return _error(500, "not_settled", "nothing was stored; retry with the same key")
        stall = faults.take_stall() if faults is not None and answer.stored else None
        if stall is not None:
            await _serve.pause(stall, stopping)
        replayed = {"Idempotent-Replayed": "true"} if answer.replayed else None
        return Response(answer.content, answer.status, replayed, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return Response(_render({"ok": True}), media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.to_thread(writer.close)  # after the last request was answered

    app = Starlette(
        routes=[
            Route("/triage", triage, methods=["POST"]),
            Route("/", triage, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.stopping = stopping
    app.state.writer = writer
    return app


# -- runners --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceiverHandle:
    url: str  # the triage URL to use as relay.url (<base>/triage)
    base_url: str
    db_path: Path
    faults: ReceiverFaults


@contextlib.contextmanager
def running(
    db_path: Path,
    faults: ReceiverFaults | None = None,
    *,
    decide: Decide = default_decide,
    secret: bytes | None = None,
    token: str | None = None,
    tolerance: float = signing.DEFAULT_TOLERANCE,
    clock: Callable[[], float] = time.time,
) -> Iterator[ReceiverHandle]:
    """Run the receiver on 127.0.0.1:<free port> in a background thread (tests, demo)."""
    faults = faults if faults is not None else ReceiverFaults()
    app = create_app(
        db_path,
        decide=decide,
        faults=faults,
        secret=secret,
        token=token,
        tolerance=tolerance,
        clock=clock,
    )
    with _serve.serving(app, on_stop=app.state.stopping.set) as base:
        yield ReceiverHandle(url=f"{base}/triage", base_url=base, db_path=db_path, faults=faults)


def serve(
    host: str,
    port: int,
    db_path: Path,
    *,
    secret: bytes | None = None,
    token: str | None = None,
    tolerance: float = signing.DEFAULT_TOLERANCE,
) -> None:
    """Run the receiver in the foreground until SIGINT/SIGTERM (`ntfy-intake receiver`)."""
    app = create_app(db_path, secret=secret, token=token, tolerance=tolerance)

    def ready(base: str) -> None:
        print(
            f"ntfy-intake receiver: POST triage requests to {base}/triage (receipts: {db_path})",
            flush=True,
        )
        if secret is None:
            print(
                "ntfy-intake receiver: warning: no secret (NTFY_INTAKE_RELAY_SECRET or "
                "--secret-file): unsigned requests are accepted, so anyone who can reach this "
                "port and knows a delivery key can claim it first",
                file=sys.stderr,
                flush=True,
            )

    _serve.serve_forever(app, host=host, port=port, on_ready=ready, on_stop=app.state.stopping.set)
