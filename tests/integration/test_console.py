"""The owner console over plain HTTP against the real daemon: sessions, CSRF, headers, silences."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ntfy_intake.rules import sanitize, silences
from ntfy_intake.store import console_reads, db, migrations
from ntfy_intake.surfaces.console import views
from ntfy_intake.testbed import receiver
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from ..harness import DaemonThread, query, settings_for, wait_until

pytestmark = pytest.mark.engines

TOKEN = "console-test-token-7Hq2Xv9Lp4"
OPEN: list[httpx.Client] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


@pytest.fixture
def emu() -> Iterator[NtfyEmulator]:
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emulator:
        yield emulator


@pytest.fixture
def console(emu: NtfyEmulator, tmp_path: Path) -> Iterator[tuple[DaemonThread, str, Path]]:
    state = tmp_path / "state"
    with receiver.running(tmp_path / "receiver.sqlite3") as triage:
        config = settings_for(
            emu.url, state, http_token=TOKEN, relay_url=triage.url, cadence_debounce="0s"
        )
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            yield running, f"http://127.0.0.1:{running.daemon.http_port}", state


def login(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, follow_redirects=False)
    OPEN.append(client)
    form = client.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    answer = client.post("/console/login", data={"csrf": csrf.group(1), "token": TOKEN})
    assert answer.status_code == 303, answer.text
    return client


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


@pytest.mark.one_engine("the console's session check; no store read")
def test_no_session_gets_the_login_page_and_no_alert_data(
    console: tuple[DaemonThread, str, Path], emu: NtfyEmulator
) -> None:
    _, base, state = console
    emu.publish("alerts", "secret-alert-body", title="Disk secret")
    wait_until(lambda: query(state, "SELECT count(*) FROM inbox") == [(1,)])
    for path in ["/console/", "/console/incidents", "/console/audit", "/console/owner"]:
        answer = httpx.get(base + path, follow_redirects=True)
        assert answer.url.path == "/console/login"
        assert "secret" not in answer.text.lower()
        assert answer.headers["content-security-policy"] == "default-src 'self'"
        assert answer.headers["x-frame-options"] == "DENY"


@pytest.mark.one_engine("the console's login; no store read")
def test_wrong_token_is_403_and_sets_no_session(console: tuple[DaemonThread, str, Path]) -> None:
    _, base, _ = console
    with httpx.Client(base_url=base) as client:
        csrf = csrf_of(client.get("/console/login").text)
        answer = client.post("/console/login", data={"csrf": csrf, "token": "wrong"})
    assert answer.status_code == 403
    assert "ntfy_intake_console" not in answer.headers.get("set-cookie", "")


@pytest.mark.one_engine("the session cookie's attributes")
def test_session_cookie_is_httponly_and_samesite_strict(
    console: tuple[DaemonThread, str, Path],
) -> None:
    _, base, _ = console
    with httpx.Client(base_url=base) as client:
        csrf = csrf_of(client.get("/console/login").text)
        answer = client.post("/console/login", data={"csrf": csrf, "token": TOKEN})
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie


@pytest.mark.one_engine("the CSRF check answers before any write")
def test_post_without_csrf_token_is_refused_and_changes_nothing(
    console: tuple[DaemonThread, str, Path],
) -> None:
    running, base, _ = console
    client = login(base)
    answer = client.post(
        "/console/silences", data={"scope": "topic", "target": "alerts", "for": "2h"}
    )
    assert answer.status_code == 403
    assert (
        running.daemon is not None
        and running.daemon.owner_queue.state.silences.active(running.daemon.clock()) == []
    )


def test_every_page_renders_for_a_session_with_the_status_in_the_title(
    console: tuple[DaemonThread, str, Path], emu: NtfyEmulator
) -> None:
    _, base, state = console
    emu.publish("alerts", "<img src=x onerror=alert(1)>", title="<script>alert(1)</script>")
    wait_until(lambda: query(state, "SELECT count(*) FROM inbox") == [(1,)])
    client = login(base)
    for path in ["/", "/incidents", "/deliveries", "/owner", "/quarantine", "/audit?kind=event"]:
        answer = client.get("/console" + path)
        assert answer.status_code == 200, path
        assert re.search(r"<title>\w+ · ", answer.text), path
        assert "<script>alert" not in answer.text and "<img src=x" not in answer.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/console/incidents").text


def test_overview_before_the_first_event_says_never_not_never_ago(
    console: tuple[DaemonThread, str, Path],
) -> None:
    """A fresh daemon's overview: no event yet reads "never", not "never ago"."""
    _, base, _ = console
    page = login(base).get("/console/").text
    assert "never ago" not in page
    assert re.search(r"<dt>last event</dt><dd>never</dd>", page), page


def test_silence_from_the_console_suppresses_the_next_owner_message_as_silenced(
    console: tuple[DaemonThread, str, Path], emu: NtfyEmulator
) -> None:
    _, base, state = console
    client = login(base)
    csrf = csrf_of(client.get("/console/").text)
    made = client.post(
        "/console/silences",
        data={"csrf": csrf, "scope": "topic", "target": "alerts", "for": "2h", "reason": "fix"},
    )
    assert made.status_code == 303
    emu.publish("alerts", "disk failing", title="Disk", priority=5)
    wait_until(
        lambda: (
            query(state, "SELECT state, last_error FROM owner_outbox WHERE kind = 'triage'")
            == [("suppressed", "silenced")]
        ),
        timeout=30,
    )
    assert "silenced" in client.get("/console/owner").text
    assert query(state, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == [(1,)]


def audit_files(state: Path) -> list[Path]:
    return sorted((state / "audit").glob("*.jsonl"))


def on_daemon_loop(running: DaemonThread, fn: Callable[[], object]) -> Future[object]:
    """Run `fn` through the daemon's own database runner (its worker thread, its lock)."""
    assert running.daemon is not None and running._loop is not None
    return asyncio.run_coroutine_threadsafe(running.daemon.database.run(fn), running._loop)


def test_overview_never_shows_half_of_a_transaction_the_writer_is_folding(
    console: tuple[DaemonThread, str, Path],
) -> None:
    """One transaction ends silence A and starts silence B. While the writer's thread is still
    running that transaction's after-COMMIT effects, the overview shows A ended and B holding,
    or neither change: never both holding (the live state read half-folded)."""
    running, base, _ = console
    assert running.daemon is not None
    daemon = running.daemon
    queue = daemon.owner_queue
    now = daemon.clock()

    def add_a() -> None:
        with db.write_txn(daemon.conn) as txn:
            fields = silences.silence_fields("sil_aaaaaaaaaaaa", "topic", "alerts", now + 3600, "")
            queue.silence(txn, "silence", now, **fields)

    on_daemon_loop(running, add_a).result(10)
    pausing, resume = threading.Event(), threading.Event()

    def swap() -> None:
        with db.write_txn(daemon.conn) as txn:
            fields = silences.silence_fields("sil_bbbbbbbbbbbb", "topic", "backups", now + 3600, "")
            queue.silence(txn, "silence", now, **fields)
            # An effect between the two records' own: the writer's thread stops here a while.
            txn.after_commit(lambda: (pausing.set(), resume.wait(10)))
            queue.silence(txn, "silence_end", now, silence_id="sil_aaaaaaaaaaaa")

    done = on_daemon_loop(running, swap)
    try:
        assert pausing.wait(10)
        page = login(base).get("/console/").text
    finally:
        resume.set()
        done.result(10)
    held = re.findall(r'name="id" value="(sil_\w+)"', page)
    assert held == ["sil_bbbbbbbbbbbb"], held
    assert "-1" not in re.findall(r'<span class="big">(-?\d+)</span>', page)


def test_a_page_is_read_and_rendered_in_the_thread_pool_not_on_the_daemons_event_loop(
    console: tuple[DaemonThread, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page rendered on the loop stops the intake (the loop reads the stream) for as long as
    the page takes; the thread pool gives the loop back every switch interval."""
    _, base, _ = console
    threads: list[str] = []
    real = views.render

    def spy(template: str, code: int, context: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(template, code, context)

    client = login(base)  # the login form: no data, rendered where it is asked for
    monkeypatch.setattr(views, "render", spy)
    for path in ["/", "/incidents", "/deliveries", "/owner", "/quarantine", "/audit"]:
        assert client.get("/console" + path).status_code == 200
    assert len(threads) == 6
    assert "daemon" not in threads  # harness.DaemonThread: the loop's thread is named so


def test_incidents_past_the_first_page_are_reached_by_the_older_link(
    console: tuple[DaemonThread, str, Path], emu: NtfyEmulator
) -> None:
    _, base, state = console
    total = console_reads.INCIDENTS_PAGE + 3
    for n in range(total):
        emu.publish("alerts", f"check {n} failed", title=f"check-{n:03d} failed")
    wait_until(lambda: query(state, "SELECT count(*) FROM incidents") == [(total,)], timeout=30)
    client = login(base)
    first = client.get("/console/incidents").text
    older = re.search(r'href="/console/incidents\?before=([0-9.-]+)"', first)
    assert older is not None, "no link to older incidents"
    second = client.get("/console/incidents", params={"before": older.group(1)}).text
    keys = re.findall(r'<span class="key">alerts:(check-\d+ failed)</span>', first + second)
    assert len(keys) == total and len(set(keys)) == total
    assert 'href="/console/incidents?before=' not in second  # the last page
    for junk in ["x", "1.", ".1", "9" * 50, "-5.3", "1.2.3"]:
        assert client.get("/console/incidents", params={"before": junk}).status_code == 200


@pytest.mark.one_engine("a template filter; no store")
def test_text_filter_prints_exactly_what_strip_control_prints_for_any_string() -> None:
    """The filter skips sanitize for a string with nothing to strip: the same output always."""

    @given(
        st.lists(
            st.one_of(
                st.characters(),
                st.sampled_from(["\x1b[31m", "\x1b]0;t\x07", "\x9b1m", "\r\n", "\u202e", "\ud800"]),
            ),
            max_size=30,
        ).map("".join)
    )
    @hsettings(max_examples=2000, deadline=None)
    def same(text: str) -> None:
        assert views._text(text) == sanitize.strip_control(str(sanitize.valid_utf8(text)))

    same()


def test_incident_page_reads_each_incidents_events_and_requests_by_index_without_sorting_all(
    tmp_path: Path,
) -> None:
    """An incident that lives for months has thousands of events and triage requests: the page
    keeps five of each, and must not sort them all to find those (the plan of every statement
    that looks up one incident's rows shows no sort beside that lookup)."""
    conn = db.connect(tmp_path / "intake.sqlite3")
    migrations.apply(conn)
    with conn:
        conn.execute(
            "INSERT INTO incidents (key, severity, status, status_time, status_event,"
            " first_seen, last_seen, events, version) VALUES ('t:x', 3, 'firing', 1, 'e', 1, 1, 1, 1)"
        )
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    console_reads.incidents(conn)
    conn.set_trace_callback(None)
    lookups = [s for s in statements if "incident_key = " in s]
    assert lookups, statements
    for sql in lookups:
        plan = [tuple(row) for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]
        searches = {parent for _, parent, _, detail in plan if "(incident_key=?)" in detail}
        sorts = {parent for _, parent, _, detail in plan if "TEMP B-TREE" in detail}
        assert searches and not searches & sorts, plan


def test_a_lone_surrogate_escape_on_the_wire_is_kept_raw_in_the_inbox_and_u_fffd_after(
    console: tuple[DaemonThread, str, Path], emu: NtfyEmulator
) -> None:
    """End to end, for a frame only a broken server or proxy sends (ntfy writes U+FFFD): the
    inbox keeps the frame with its escape (ASCII JSON, valid UTF-8), the incident key and the
    audit line hold U+FFFD, and the console shows U+FFFD."""
    _, base, state = console
    emu.wait_for_subscribers(1)
    line = (
        f'{{"id":"loneSurrog8a","time":{int(time.time())},"event":"message","topic":"alerts",'
        '"title":"raw \\ud800 title","message":"raw \\udfff body"}\n'
    )
    assert emu.faults.inject_raw(line.encode()) == 1
    wait_until(lambda: query(state, "SELECT count(*) FROM inbox") == [(1,)])
    ((raw, key),) = query(state, "SELECT raw, incident_key FROM inbox")
    assert '"title":"raw \\ud800 title"' in raw and key == "alerts:raw \ufffd title"
    wait_until(lambda: b"loneSurrog8a" in b"".join(p.read_bytes() for p in audit_files(state)))
    (record,) = [
        found
        for path in audit_files(state)
        for text in path.read_bytes().splitlines()
        if (found := json.loads(text)).get("event_id") == "loneSurrog8a"
        and found["kind"] == "event"
    ]
    assert record["incident"] == "alerts:raw \ufffd title"
    page = login(base).get("/console/incidents")
    assert page.status_code == 200
    assert "raw \ufffd title" in page.text and "raw \ufffd body" in page.text
    assert "\\ud800" not in page.text


@pytest.mark.one_engine("the garbage collector's setting while serving")
def test_a_full_collection_skips_start_ups_objects_while_serving_and_not_after(
    emu: NtfyEmulator, tmp_path: Path
) -> None:
    """A full collection walked every object start-up made (15-50 ms on a shared machine, every
    few dozen incident pages, the writer and the loop waiting): they are frozen while the HTTP
    surface serves, and unfrozen when it stops (a process may run the next daemon)."""
    config = settings_for(emu.url, tmp_path / "state", http_token=TOKEN)
    assert gc.get_freeze_count() == 0
    with DaemonThread(config) as running:
        wait_until(lambda: running.daemon is not None and running.daemon.http_port)
        assert gc.get_freeze_count() > 10_000
    assert gc.get_freeze_count() == 0


def test_a_page_read_that_fails_raises_its_own_error_not_the_rollbacks(tmp_path: Path) -> None:
    """When SQLite has already ended the page's read transaction (as it does on some errors),
    the ROLLBACK on the way out must not replace the page's error with "no transaction"."""
    conn = db.connect(tmp_path / "intake.sqlite3")
    migrations.apply(conn)
    with pytest.raises(LookupError), console_reads.snapshot(conn):
        conn.execute("ROLLBACK")  # what SQLite does by itself on, e.g., SQLITE_FULL
        raise LookupError("the page's own error")
    assert not conn.in_transaction
