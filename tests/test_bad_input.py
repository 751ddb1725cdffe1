"""Bad input, generated: the decoder, the inbox and the whole daemon against arbitrary frames.

Whatever ntfy (or a broken proxy in front of it) sends, the daemon never crashes, every line is
accounted for (recorded as an event, a duplicate, or quarantined with its reason), and no raw
control character reaches a log line. Bad configuration too: a bad `[cluster]` stops every
command with exit 2 and one line naming the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ntfy_intake.flow import owner
from ntfy_intake.runtime import logs
from ntfy_intake.store import db, inbox, migrations
from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator
from ntfy_intake.wire.frames import DeviceAction, Ignored, Junk, Message, decode_line

from . import engines, harness
from .conftest import TOPICS, CliRun, owner_queue
from .harness import DaemonThread, daemon_process, env_for, query, settings_for, wait_until

pytestmark = pytest.mark.engines

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

# Lone surrogates are valid ASCII on the wire (a JSON "\\ud83d" escape) and a crash at the first
# UTF-8 write: st.text() leaves them out unless asked.
surrogate_text = st.text(
    st.one_of(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.characters()),
    max_size=12,
)
nasty_text = st.one_of(
    st.text(max_size=40),
    surrogate_text,
    st.sampled_from(
        [
            "",
            " ",
            "\x1b[31mred\x1b[0m",
            "\x1b]0;title\x07",
            "a\nb\rc",
            "\u202eevil",
            "\x00\x01\x9b",
            "disk \ud83d",
            "\udc00\x00\x1b[2J",
            "x" * 5000,
            "\ud83d" * 70_000,
        ]
    ),
)
deep = st.sampled_from(
    [
        '{"incident":"disk \\ud83d","severity":5,"status":"firing"}',  # issue 12, finding 1
        '{"incident":["\\udc00"],"severity":"\\ud800"}',
    ]
) | st.sampled_from(
    [json.dumps([[[[["\ud83d"]]]]]), "[" * 5000 + "]" * 5000, '{"a":' * 800 + "1" + "}" * 800]
)
ids = st.one_of(
    st.text(ALNUM, min_size=12, max_size=12), st.text(max_size=14), st.integers(), st.none()
)
ints = st.one_of(
    st.integers(-5, 2_000_000_000),
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.none(),
)
envelopes = st.builds(
    lambda incident, severity, status: json.dumps(
        {"incident": incident, "severity": severity, "status": status}
    ),
    st.one_of(nasty_text, st.integers(), st.lists(surrogate_text, max_size=2)),
    st.one_of(st.integers(-3, 9), st.booleans(), st.text(max_size=3)),
    st.sampled_from(["firing", "resolved", "pwned", 3]),
)


@st.composite
def frames(draw: Any) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "id": draw(ids),
        "time": draw(ints),
        "event": draw(
            st.sampled_from(
                [
                    "message",
                    "message",
                    "message",
                    "open",
                    "keepalive",
                    "poll_request",
                    "message_delete",
                    "bogus",
                    7,
                ]
            )
        ),
        "topic": draw(st.sampled_from(["alerts", "backups", "other", "bad topic", "", 5])),
    }
    if draw(st.booleans()):
        frame["expires"] = draw(ints)
    if draw(st.booleans()):
        frame["title"] = draw(st.one_of(nasty_text, st.integers()))
    frame["message"] = draw(st.one_of(nasty_text, envelopes, deep, st.integers()))
    if draw(st.booleans()):
        frame["priority"] = draw(st.one_of(st.integers(-1, 7), st.booleans(), st.text(max_size=2)))
    if draw(st.booleans()):
        frame["tags"] = draw(
            st.one_of(
                st.lists(nasty_text, max_size=3), nasty_text, st.lists(st.integers(), max_size=2)
            )
        )
    return {k: v for k, v in frame.items() if v is not None}


# Well-formed message frames whose *values* are hostile: they pass validation and reach storage.
well_formed = st.builds(
    lambda event_id, title, message, tags: {
        "id": event_id,
        "time": 1_764_470_000,
        "expires": 1_764_513_200,
        "event": "message",
        "topic": "alerts",
        "title": title,
        "message": message,
        "tags": tags,
    },
    st.text(ALNUM, min_size=12, max_size=12),
    nasty_text,
    st.one_of(nasty_text, envelopes, deep),
    st.lists(nasty_text, max_size=2),
)

raw_lines = st.one_of(
    frames().map(lambda f: json.dumps(f).encode()),
    well_formed.map(lambda f: json.dumps(f).encode()),
    st.binary(max_size=60).filter(lambda b: b"\n" not in b),
    st.sampled_from(
        [b"{", b"[]", b"null", b'{"event":"message"}', b"\xff\xfe", b'"just a string"']
    ),
)


def accounted(conn: db.Connection, line: bytes) -> bool:
    """The line was recorded (an inbox row with its id) or quarantined (its hash or its id)."""
    if not line.strip():
        return True  # blank lines are NDJSON padding: skipped by design
    frame = decode_line(line, TOPICS)
    if isinstance(frame, Message | DeviceAction | Ignored):  # an outcome under its own id
        return (
            conn.execute("SELECT 1 FROM inbox WHERE event_id = ?", (frame.id,)).fetchone()
            is not None
        )
    if frame.__class__.__name__ in ("Open", "Keepalive"):
        return True
    assert isinstance(frame, Junk)
    row = conn.execute(
        "SELECT reason FROM quarantine WHERE raw_sha256 = ?", (frame.raw_sha256,)
    ).fetchone()
    return row is not None and bool(row[0])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(raw_lines, min_size=1, max_size=20))
def test_inbox_records_or_quarantines_every_line_and_never_raises(
    store: db.Connection, lines: list[bytes]
) -> None:
    queue = owner_queue()
    decoded = [decode_line(line, TOPICS) for line in lines]
    batch = [f for f in decoded if isinstance(f, Message | DeviceAction | Ignored | Junk)]
    inbox.record_batch(store, batch, 1_764_470_000.0, queue=queue, relay_enabled=True)
    for line in lines:
        assert accounted(store, line), line


@contextlib.contextmanager
def fresh_store() -> Iterator[db.Connection]:
    """One empty database per hypothesis example (a fixture would be shared by all of them), on
    the test's engine: a file, or a schema of its own."""
    server = engines.server_dsn() if harness.DATABASE is not None else None
    with tempfile.TemporaryDirectory() as directory:
        schema, target = (None, Path(directory) / "intake.sqlite3")
        if server is not None:
            schema, target = engines.create_schema(server)
        conn = db.connect(target)
        try:
            migrations.apply(conn)
            yield conn
        finally:
            conn.close()
            if server is not None and schema is not None:
                engines.drop_schema(server, schema)


def event_outcomes(conn: db.Connection) -> dict[str, int]:
    counts: dict[str, int] = {}
    for (line,) in conn.execute("SELECT line FROM audit_journal"):
        record = json.loads(line)
        if record.get("kind") == "event":
            counts[record["event_id"]] = counts.get(record["event_id"], 0) + 1
    return counts


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(well_formed, frames()).map(lambda f: json.dumps(f).encode()),
        min_size=1,
        max_size=12,
    )
)
def test_hostile_values_never_escape_and_each_event_has_exactly_one_outcome(
    lines: list[bytes],
) -> None:
    """The boundary rule (issue 12): surrogates, deep nesting, huge strings, wrong types, NUL and
    ANSI go through decode and the inbox without an exception, and each event id gets one
    outcome record however often the batch is replayed."""
    with fresh_store() as store:
        queue = owner_queue()
        decoded = [decode_line(line, TOPICS) for line in lines]
        batch = [f for f in decoded if isinstance(f, Message | Junk)]
        for _ in range(2):  # the second pass is ntfy replaying the same frames
            inbox.record_batch(store, batch, 1_764_470_000.0, queue=queue, relay_enabled=True)
        ids = {f.id for f in batch if isinstance(f, Message)}
        outcomes = event_outcomes(store)
        assert set(outcomes) == ids
        assert all(count == 1 for count in outcomes.values()), outcomes
        for frame in batch:
            if isinstance(frame, Message):
                for text in (frame.message, frame.title or "", *frame.tags):
                    text.encode("utf-8")  # valid UTF-8 after decode: never raises


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(nasty_text, min_size=1, max_size=6))
def test_hostile_owner_message_text_is_queued_once_and_sendable(texts: list[str]) -> None:
    """An agent's or receiver's reply with a lone surrogate or controls: queued, never a crash."""
    with fresh_store() as store:
        queue = owner_queue(daily_cap=100)
        for attempt in range(2):  # the agent retries with the same key
            for index, text in enumerate(texts):
                with db.write_txn(store) as txn:
                    result, _ = queue.triage_message(txn, f"k{index}", text, 1_764_470_000.0)
                assert result == ("duplicate" if attempt else "queued")
        rows = store.execute("SELECT key, text FROM owner_outbox WHERE kind = 'triage'").fetchall()
        assert len(rows) == len(texts)
        for _, text in rows:
            owner.prepare_text(text).encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=8), st.one_of(nasty_text, st.integers(), st.none()), max_size=5
    )
)
def test_log_lines_never_carry_raw_control_characters(fields: dict[str, Any]) -> None:
    event = dict(fields)
    cleaned = logs._sanitize(None, "info", event)
    for value in cleaned.values():
        if isinstance(value, str):
            assert not CONTROL.search(value.replace("\n", "")), value


@pytest.fixture  # per test: on the test's engine (a module-wide daemon would outlive its schema)
def live_daemon(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NtfyEmulator, Path, DaemonThread]]:
    state = tmp_path_factory.mktemp("fuzz-state")
    with (
        NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu,
        DaemonThread(settings_for(emu.url, state)) as running,
    ):
        emu.wait_for_subscribers(1)
        wait_until(lambda: running.daemon is not None and running.daemon.health.state == "live")
        yield emu, state, running


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(raw_lines, min_size=1, max_size=15))
def test_daemon_survives_arbitrary_frames_and_accounts_for_every_line(
    live_daemon: tuple[NtfyEmulator, Path, DaemonThread], lines: list[bytes]
) -> None:
    emu, state, running = live_daemon
    marker = emu.publish(
        "alerts",
        "end of this example",
        title="marker " + hashlib.sha256(b"".join(lines)).hexdigest()[:8],
    )
    assert emu.faults.inject_raw(b"".join(line + b"\n" for line in lines)) == 1
    emu.publish("alerts", "after the junk", title="after")  # the stream still flows after the junk
    conn = db.connect(harness.store_of(state), readonly=True)
    try:
        wait_until(
            lambda: (
                query(state, "SELECT count(*) FROM inbox WHERE event_id = ?", marker["id"])
                == [(1,)]
            )
        )
        wait_until(
            lambda: all(accounted(conn, line) for line in lines),
            timeout=10,
            what="every line accounted for",
        )
    finally:
        conn.close()
    assert running.daemon is not None and not running.daemon.failed
    assert running.daemon.health.state == "live", running.daemon.health


@pytest.mark.slow
def test_no_raw_control_character_reaches_the_daemon_log(tmp_path: Path) -> None:
    nasty = [
        b'{"id":"abcdefghij12","time":1,"event":"message","topic":"alerts\\u001b[2J","message":"x"}',
        b'{"event":"\\u001b]0;pwned\\u0007","id":"abcdefghij13"}',
        b"\x1b[31mraw escape\x1b[0m",
        b'{"id":"abcdefghij14","time":1,"expires":2,"event":"message","topic":"alerts","title":"\\u009b\\u0000","message":"\\u001b[5m"}',
    ]
    log_path = tmp_path / "daemon.log"
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu:
        env = env_for(emu.url, tmp_path / "state")
        with log_path.open("wb") as log_file, daemon_process(env, stdout=log_file) as proc:
            emu.wait_for_subscribers(1, timeout=30)
            emu.faults.inject_raw(b"\n".join(nasty) + b"\n")
            # Junk is quarantined; the unknown event kind (with an id) is recorded as ignored.
            wait_until(
                lambda: (
                    query(
                        tmp_path / "state",
                        "SELECT (SELECT count(*) FROM quarantine)"
                        " + (SELECT count(*) FROM inbox WHERE outcome = 'ignored')",
                    )[0][0]
                    >= 3
                ),
                timeout=15,
            )
            emu.faults.drop_connections()  # make it log a reconnect, too
            wait_until(lambda: emu.subscriber_count() >= 1, timeout=30)
            proc.terminate()
            assert proc.wait(timeout=20) == 0
    text = log_path.read_bytes().decode("utf-8")
    assert "intake.connected" in text
    assert not CONTROL.search(text.replace("\n", "")), "raw control character in the daemon log"
    assert subprocess.run(["true"], check=False).returncode == 0


# ----------------------------------------------------------------------------------------------------
# A bad [cluster] at the command line (issue 24): exit 2, one line naming the key, no traceback.

# Never contacted: a config error stops start-up before any I/O.
UNREACHABLE_DSN = "postgresql://intake@127.0.0.1:9/intake"
NEEDS_DATABASE = (
    "[cluster] needs [state] database (PostgreSQL): a standby shares one database with its leader"
)


@pytest.mark.sqlite_only("no store is opened: each case names its engine in the config itself")
@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize(
    ("cluster", "database", "key", "says"),
    [
        ({"NODE": "pi-b"}, None, "cluster.node (NTFY_INTAKE_CLUSTER_NODE)", NEEDS_DATABASE),
        (
            {"LEASE_TTL": "5s"},
            UNREACHABLE_DSN,
            "cluster.lease_ttl (NTFY_INTAKE_CLUSTER_LEASE_TTL)",
            "lease_ttl (5s) must be at least 3 x renew_every (2s)",
        ),
        (
            {"RENEW_EVERY": "3s"},
            UNREACHABLE_DSN,
            "cluster.renew_every (NTFY_INTAKE_CLUSTER_RENEW_EVERY)",
            "lease_ttl (8s) must be at least 3 x renew_every (3s)",
        ),
        (
            {"RENEW_EVERY": "2"},
            UNREACHABLE_DSN,
            "cluster.renew_every (NTFY_INTAKE_CLUSTER_RENEW_EVERY)",
            "a number needs a unit",
        ),
        (
            {"NODE": "pi b"},
            UNREACHABLE_DSN,
            "cluster.node (NTFY_INTAKE_CLUSTER_NODE)",
            "must not contain whitespace",
        ),
    ],
    ids=["on-sqlite", "under-3x", "renew-only-under-3x", "bare-number", "node-with-space"],
)
def test_a_bad_cluster_setting_exits_2_with_one_line_naming_the_key(
    tmp_path: Path,
    command: str,
    cluster: dict[str, str],
    database: str | None,
    key: str,
    says: str,
    cli_in_process: CliRun,
) -> None:
    env = {
        "NTFY_INTAKE_NTFY_URL": "http://127.0.0.1:9",
        "NTFY_INTAKE_NTFY_TOPICS": "alerts",
        "NTFY_INTAKE_STATE_DIR": str(tmp_path / "state"),
        **{f"NTFY_INTAKE_CLUSTER_{name}": value for name, value in cluster.items()},
    }
    if database is not None:
        env["NTFY_INTAKE_STATE_DATABASE"] = database
    result = cli_in_process(command, env=env)  # refused before any daemon: no child needed
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"config error: {key}: ") and says in line, line
    assert not (tmp_path / "state").exists()  # refused before touching anything


@pytest.mark.sqlite_only("no store is opened: the config file names no database")
def test_a_cluster_section_in_the_file_of_a_sqlite_install_exits_2_with_one_line(
    tmp_path: Path, cli_in_process: CliRun
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[ntfy]\nurl = "http://127.0.0.1:9"\ntopics = ["alerts"]\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n'
        '[cluster]\nnode = "pi-b"\nlease_ttl = "12s"\nrenew_every = "3s"\n'
    )
    result = cli_in_process("run", env={"NTFY_INTAKE_CONFIG": str(config)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"config error: cluster.node: {NEEDS_DATABASE}"]
