"""The `feed catch-up|ack|wait` core: JSON on stdout, exit codes, one-line errors on stderr."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.store import outbox
from ntfy_intake.store.db import write_txn as db_write_txn
from ntfy_intake.store.feed import FeedStore
from ntfy_intake.surfaces import feed_cli

from .. import harness

pytestmark = pytest.mark.engines


@pytest.fixture
def db_path(tmp_path: Path) -> Any:
    """The test's store on its engine (a DSN on PostgreSQL)."""
    return harness.store_of(tmp_path / "state")


def post(db_path: Path, summary: str = "alerts: 'Disk' sev 4", message: str = "disk full") -> int:
    with FeedStore.open(db_path) as store:
        payload = {"events": [{"message": message}]}
        return store.post("triage", payload, sender="ntfy-intake", summary=summary).seq


def run(capsys: pytest.CaptureFixture[str], code: int) -> tuple[int, object, str]:
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else None), err


def test_first_catch_up_joins_at_head_and_at_start_gives_history(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    post(db_path, "one")
    post(db_path, "two")
    assert run(capsys, feed_cli.catch_up(db_path, "newcomer")) == (0, [], "")
    code, entries, _ = run(capsys, feed_cli.catch_up(db_path, "historian", at="start"))
    assert code == 0
    assert isinstance(entries, list)
    assert [(e["channel"], e["seq"]) for e in entries] == [("triage", 1), ("triage", 2)]
    assert {"channel", "seq", "delivery_key", "payload"} <= set(entries[0])
    assert entries[0]["payload"] == {"events": [{"message": "disk full"}]}


def test_catch_up_output_is_ascii_so_untrusted_text_cannot_drive_the_terminal(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feed_cli.catch_up(db_path, "triager")
    capsys.readouterr()
    post(db_path, "x", message="\x1b]0;pwned\x07 \u202e gnp.exe")
    feed_cli.catch_up(db_path, "triager")
    out = capsys.readouterr().out
    assert out.isascii()
    assert json.loads(out)[0]["payload"]["events"][0]["message"].startswith("\x1b]0;pwned")


def test_ack_prints_the_cursor_and_a_stale_ack_exits_0_unchanged(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feed_cli.catch_up(db_path, "triager")
    post(db_path)
    post(db_path)
    capsys.readouterr()
    assert run(capsys, feed_cli.ack(db_path, "triager", "triage", 2)) == (
        0,
        {"channel": "triage", "cursor": 2},
        "",
    )
    assert run(capsys, feed_cli.ack(db_path, "triager", "triage", 1)) == (
        0,
        {"channel": "triage", "cursor": 2},
        "",
    )


def test_ack_beyond_head_exits_2_with_one_line_and_no_stdout(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feed_cli.catch_up(db_path, "triager")
    post(db_path)
    capsys.readouterr()
    code, out, err = run(capsys, feed_cli.ack(db_path, "triager", "triage", 5))
    assert (code, out) == (2, None)
    assert "beyond head" in err
    assert err.count("\n") == 1
    with FeedStore.open(db_path) as store:
        assert store.cursor("triager", "triage") == 0


def test_invalid_handle_exits_2(db_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for code in (
        feed_cli.catch_up(db_path, "bad handle"),
        feed_cli.ack(db_path, "bad\nhandle", "triage", 1),
        feed_cli.wait(db_path, "", 0),
    ):
        assert code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 3


def test_unopenable_database_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_a_db = tmp_path / "intake.sqlite3"
    not_a_db.write_bytes(b"this is not sqlite" * 100)
    assert feed_cli.catch_up(not_a_db, "triager") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("ntfy-intake feed: ")


def test_wait_rings_at_once_over_backlog_with_a_wake_line_only(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    feed_cli.catch_up(db_path, "triager")
    post(db_path, "alerts: 'Disk'", message="PAYLOAD-BODY")
    capsys.readouterr()
    started = time.monotonic()
    code, out, _ = run(capsys, feed_cli.wait(db_path, "triager", 30))
    assert code == 0
    assert time.monotonic() - started < 10
    assert isinstance(out, dict)
    assert set(out) == {"wake_line"}
    assert "PAYLOAD-BODY" not in out["wake_line"]
    assert out["wake_line"].startswith("'triage'#1 from 'ntfy-intake': [untrusted] ")


def test_wait_prints_null_and_exits_1_on_timeout(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert feed_cli.wait(db_path, "triager", 0.2) == 1
    assert capsys.readouterr().out == "null\n"


@pytest.mark.parametrize("timeout", [-1.0, float("nan"), float("inf")])
def test_wait_with_a_bad_timeout_exits_2(
    db_path: Path, capsys: pytest.CaptureFixture[str], timeout: float
) -> None:
    assert feed_cli.wait(db_path, "triager", timeout) == 2
    assert capsys.readouterr().out == ""


def test_a_first_wait_joins_so_the_entry_that_rang_is_caught_up(
    db_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FeedStore.open(db_path):
        pass
    timer = threading.Timer(0.2, post, args=(db_path, "late"))
    timer.start()
    try:
        assert feed_cli.wait(db_path, "fresh", 30) == 0
    finally:
        timer.join()
    capsys.readouterr()
    code, entries, _ = run(capsys, feed_cli.catch_up(db_path, "fresh"))
    assert code == 0
    assert isinstance(entries, list)
    assert [e["seq"] for e in entries] == [1]


_SCRIPT = """
import sys
from ntfy_intake.surfaces import feed_cli
db, op, arg = sys.argv[1], sys.argv[2], (sys.argv[3:] or [""])[0]
if op == "catch_up":
    sys.exit(feed_cli.catch_up(db, "triager"))
if op == "ack":
    sys.exit(feed_cli.ack(db, "triager", "triage", int(arg)))
sys.exit(feed_cli.wait(db, "triager", float(arg)))
"""


@pytest.mark.slow
def test_the_loop_works_from_a_fresh_interpreter(db_path: Path) -> None:
    def call(op: str, arg: str = "") -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(db_path), op, arg],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.returncode, done.stdout, done.stderr

    assert call("catch_up") == (0, "[]\n", "")
    post(db_path)
    code, out, err = call("wait", "30")
    assert (code, err) == (0, "")
    assert json.loads(out)["wake_line"].startswith("'triage'#1 from ")
    code, out, _ = call("catch_up")
    assert (code, [e["seq"] for e in json.loads(out)]) == (0, [1])
    assert call("ack", "1") == (0, '{"channel": "triage", "cursor": 1}\n', "")
    code, out, err = call("ack", "9")
    assert (code, out) == (2, "")
    assert "beyond head" in err and err.count("\n") == 1
    assert call("wait", "0.2") == (1, "null\n", "")


def test_catch_up_says_requests_wait_in_the_debounce_window_instead_of_looking_broken(
    store: sqlite3.Connection, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = harness.store_of(tmp_path)
    code, entries, err = run(capsys, feed_cli.catch_up(db, "triage"))
    assert (code, entries, err) == (0, [], "")  # nothing collecting: no note
    with db_write_txn(store):
        outbox.create(store, "tri_a", "alerts:disk full", "new", time.time() + 97, time.time())
        outbox.create(store, "tri_b", "alerts:nas down", "new", time.time() + 120, time.time())
    code, entries, err = run(capsys, feed_cli.catch_up(db, "triage"))
    assert (code, entries) == (0, [])
    assert err.startswith("ntfy-intake feed: 2 triage request(s) still collecting")
    assert "released in 9" in err and err.count("\n") == 1


def test_debounce_note_is_silent_with_nothing_collecting() -> None:
    assert feed_cli.debounce_note(0, None, 0.0) is None
    assert feed_cli.debounce_note(1, 50.0, 100.0) == (
        "1 triage request(s) still collecting in their debounce window (cadence.debounce), "
        "not in the feed yet; the next is released in 0 s"
    )
