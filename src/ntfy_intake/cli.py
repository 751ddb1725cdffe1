"""`ntfy-intake`: the command line. The only reader of sys.argv; maps errors to exit codes.

Exit codes: 0 ok, 1 unhealthy / failed, 2 bad configuration or usage (one line naming the key),
or an environment that cannot work (a port in use, an unusable state directory).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ntfy_intake import __version__
from ntfy_intake.errors import ConfigError, IntakeError, StartupError
from ntfy_intake.surfaces import silence_cli, store_cli

if TYPE_CHECKING:
    from ntfy_intake.runtime.daemon import Daemon
    from ntfy_intake.settings import Settings
    from ntfy_intake.store.db import Connection

Command = Callable[[argparse.Namespace], int]

# Default ports of the loopback test bed. The emulator stays off 8080, the usual port of
# signal-cli-rest-api, so both can run on one machine as the docs show.
EMULATOR_PORT = 8786
RECEIVER_PORT = 8790
SIGNAL_STANDIN_PORT = 8791


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command: Command = args.command
    try:
        return command(args)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except StartupError as exc:  # a permanent cause: exit 2 ends systemd's restart loop
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except IntakeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ntfy-intake",
        description="Exactly one recorded outcome per ntfy alert, across any crash.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    def add(name: str, command: Command, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
        )
        p.set_defaults(command=command)
        return p

    def config_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config",
            type=Path,
            default=None,
            help="TOML config file (env: NTFY_INTAKE_CONFIG; default: /etc/ntfy-intake/config.toml "
            "when it exists); every key also has an env twin NTFY_INTAKE_<SECTION>_<KEY>",
        )
        p.add_argument(
            "--allow-insecure-permissions",
            action="store_true",
            help="accept a config or secret file that group or others can read (not advised)",
        )

    p = add("run", _cmd_run, "run the daemon in the foreground")
    config_arg(p)

    p = add("status", _cmd_status, "show intake, outbox and audit state")
    config_arg(p)
    p.add_argument("--json", action="store_true", help="one JSON object, for machines")

    p = add("check", _cmd_check, "exit 0 when healthy, 1 when not (container health check)")
    config_arg(p)
    add("token", _cmd_token, "print a new random http.token (32 random bytes, URL-safe)")

    p = add("redrive", _cmd_redrive, "put dead triage requests back in the relay queue")
    config_arg(p)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--all", action="store_true", help="every dead row")
    group.add_argument("keys", nargs="*", default=[], metavar="KEY", help="delivery keys")

    p = add("silence", _cmd_silence, "silence a topic or an incident through the running daemon")
    for action in silence_cli.add_arguments(p):
        config_arg(action)

    p = add("store", _cmd_store, "move the state into PostgreSQL (store copy --to DSN)")
    for action in store_cli.add_arguments(p):
        config_arg(action)

    p = add("feed", _cmd_feed, "agent feed: catch up, ack and wait (JSON on stdout)")
    feed_sub = p.add_subparsers(dest="feed_command", required=True, metavar="ACTION")
    for name, help_text in (
        ("catch-up", "print every unacked entry as a JSON array (joins at head on first use)"),
        ("ack", "move the handle's cursor forward after handling; prints the cursor"),
        ("wait", "peek-only doorbell: print a wake line when there is something to handle"),
    ):
        action = feed_sub.add_parser(
            name,
            help=help_text,
            description=help_text,
        )
        config_arg(action)
        action.add_argument(
            "--state-dir", type=Path, default=None, help="state directory (instead of --config)"
        )
        action.add_argument("--handle", required=True, help="a stable role name, e.g. triage")
        if name == "ack":
            action.add_argument(
                "--channel", default="triage", help="the entry's channel (default: %(default)s)"
            )
            action.add_argument("--seq", required=True, type=int, help="the entry's seq")
        else:
            action.add_argument(
                "--channel", default=None, help="one channel only (default: every joined one)"
            )
            action.add_argument(
                "--at",
                choices=("head", "start"),
                default="head",
                help="where a new handle joins: head (only new entries, the default) or start (history)",
            )
        if name == "wait":
            action.add_argument(
                "--timeout",
                type=float,
                default=30.0,
                help='seconds (default: %(default)s); prints {"wake_line": ...} and exits 0 when it '
                "rings, prints null and exits 1 on timeout, exits 2 on error",
            )

    p = add("emulator", _cmd_emulator, "run the bundled ntfy-compatible server")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--port", type=int, default=EMULATOR_PORT, help="port to listen on (default: %(default)s)"
    )
    p.add_argument("--keepalive", default="45s", help="keepalive interval (default: %(default)s)")
    p.add_argument(
        "--cache-duration", default="12h", help="message cache duration (default: %(default)s)"
    )
    p.add_argument(
        "--no-rate-limits",
        action="store_true",
        help="turn off ntfy's request limiter and 30-subscription limit (on by default, as in ntfy)",
    )
    p.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="TOKEN[=TOPICS]",
        help="turn auth on, as ntfy with an auth-file: TOKEN (tk_ + 29 lowercase letters or "
        "digits) may read TOPICS (comma-separated, * wildcards; default every topic); repeatable. "
        "Without it, anyone may read",
    )

    p = add("receiver", _cmd_receiver, "run the reference triage receiver")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s; "
        "see docs/triage-contract.md before exposing it)",
    )
    p.add_argument(
        "--port", type=int, default=RECEIVER_PORT, help="port to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--db",
        type=Path,
        default=None,
        help="receipt store (default: $XDG_STATE_HOME/ntfy-intake/receiver.sqlite3, "
        "~/.local/state/... when unset)",
    )
    p.add_argument(
        "--secret-file",
        type=Path,
        default=None,
        help="Standard Webhooks secret (whsec_...) to verify deliveries with "
        "(env: NTFY_INTAKE_RELAY_SECRET or NTFY_INTAKE_RELAY_SECRET_FILE)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="require this bearer token (env: NTFY_INTAKE_RELAY_TOKEN or _FILE)",
    )
    p.add_argument(
        "--allow-insecure-permissions",
        action="store_true",
        help="accept a secret file that group or others can read (not advised)",
    )

    p = add("signal-standin", _cmd_signal_standin, "run the Signal stand-in (POST /v2/send)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--port",
        type=int,
        default=SIGNAL_STANDIN_PORT,
        help="port to listen on (default: %(default)s)",
    )

    p = add("drill", _cmd_drill, "kill -9 verification: crash the daemon, check every id, verdict")
    from ntfy_intake.testbed.drill_args import add_arguments  # noqa: PLC0415

    add_arguments(p)

    p = add("demo", _cmd_demo, "zero-setup end-to-end demo on loopback, in a temp dir")
    p.add_argument("--alerts", type=int, default=0, help="extra generated alerts to publish")
    return parser


def _load_settings(args: argparse.Namespace, *, need_ntfy: bool = True) -> Settings:
    """`--config`, else $NTFY_INTAKE_CONFIG, else /etc/ntfy-intake/config.toml if it exists.

    Read-only commands (status, check, redrive, feed) pass need_ntfy=False: they only open the
    state directory, so a missing ntfy.url is no reason to refuse them."""
    from ntfy_intake import settings  # noqa: PLC0415 - imports stay lazy so `--help` is fast

    path = settings.config_path(args.config, os.environ)
    return settings.load(
        path,
        os.environ,
        need_ntfy=need_ntfy,
        allow_insecure_permissions=getattr(args, "allow_insecure_permissions", False),
    )


def _cmd_run(args: argparse.Namespace) -> int:
    # A stop request that arrives while we are still importing and recovering must not kill us
    # mid-recovery (exit -15): remember it and stop gracefully as soon as the loop runs.
    early_stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: early_stop.set())
    from ntfy_intake.runtime import logs, node  # noqa: PLC0415
    from ntfy_intake.runtime.daemon import CrashPoints, Daemon  # noqa: PLC0415
    from ntfy_intake.runtime.preflight import check_state_dir  # noqa: PLC0415
    from ntfy_intake.runtime.sdnotify import Notifier, watchdog_interval  # noqa: PLC0415

    settings = _load_settings(args)
    check_state_dir(settings.state.dir)
    logs.configure()
    from ntfy_intake.runtime import clock  # noqa: PLC0415

    notifier = Notifier.from_environ(os.environ)

    def daemon(**cluster: Any) -> Daemon:  # one per term on PostgreSQL (runtime/node.py)
        return Daemon(
            settings,
            clock=clock.from_environ(),  # the system clock unless a drill injects an offset
            crash_points=CrashPoints(os.environ.get("NTFY_INTAKE_TEST_CRASH_AT")),
            notifier=notifier,
            watchdog_interval=watchdog_interval(os.environ, os.getpid()),
            **cluster,
        )

    return asyncio.run(node.serve_process(settings, daemon, notifier, early_stop))


def _open_readonly(args: argparse.Namespace) -> tuple[Connection | None, Settings]:
    from ntfy_intake.store import db  # noqa: PLC0415

    settings = _load_settings(args, need_ntfy=False)
    path = settings.state.store
    return (db.connect(path, readonly=True) if db.exists(path) else None), settings


def _no_state(settings: Settings) -> str:
    return (
        f"no state yet at {settings.state.store}: has the daemon run with this state.dir? "
        "(give the daemon's config with --config, or set NTFY_INTAKE_STATE_DIR)"
    )


def _cmd_status(args: argparse.Namespace) -> int:
    from ntfy_intake.surfaces import status  # noqa: PLC0415

    conn, settings = _open_readonly(args)
    if conn is None:
        print(_no_state(settings), file=sys.stderr)
        return 1
    report = status.collect(conn, settings, time.time())
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(status.render(report))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from ntfy_intake.surfaces import status  # noqa: PLC0415

    conn, settings = _open_readonly(args)
    if conn is None:
        print(f"unhealthy: {_no_state(settings)}", file=sys.stderr)
        return 1
    ok, why = status.healthy(status.collect(conn, settings, time.time()))
    print(("healthy: " if ok else "unhealthy: ") + why)
    return 0 if ok else 1


def _cmd_token(args: argparse.Namespace) -> int:
    from ntfy_intake.settings import token  # noqa: PLC0415

    return token.print_one()


def _cmd_redrive(args: argparse.Namespace) -> int:
    from ntfy_intake.store import db, outbox  # noqa: PLC0415

    settings = _load_settings(args, need_ntfy=False)
    if not db.exists(settings.state.store):
        print(_no_state(settings), file=sys.stderr)
        return 1
    conn = db.connect(settings.state.store)
    try:
        redriven = outbox.redrive(conn, None if args.all else list(args.keys), time.time())
    finally:
        conn.close()
    missing = [] if args.all else sorted(set(args.keys) - set(redriven))
    print(f"redriven {len(redriven)} dead row(s)")
    for key in missing:
        print(f"not dead or unknown: {key}", file=sys.stderr)
    return 1 if missing else 0


def _cmd_feed(args: argparse.Namespace) -> int:
    from ntfy_intake.surfaces import feed_cli  # noqa: PLC0415

    state = _load_settings(args, need_ntfy=False).state  # `--state-dir` names SQLite's file;
    use_dir = args.state_dir is not None and state.database is None  # [state] database wins
    db_path = args.state_dir / "intake.sqlite3" if use_dir else state.store
    if args.feed_command == "catch-up":
        return feed_cli.catch_up(db_path, args.handle, channel=args.channel, at=args.at)
    if args.feed_command == "ack":
        return feed_cli.ack(db_path, args.handle, args.channel, args.seq)
    return feed_cli.wait(db_path, args.handle, args.timeout, channel=args.channel, at=args.at)


def _cmd_store(args: argparse.Namespace) -> int:
    from ntfy_intake.runtime.recovery import StateLock  # noqa: PLC0415

    settings = _load_settings(args, need_ntfy=False)
    lock = StateLock(settings.state.dir / "daemon.lock")
    return store_cli.run(settings, store_cli.target_dsn(args), lock)


def _cmd_silence(args: argparse.Namespace) -> int:
    return silence_cli.run(_load_settings(args, need_ntfy=False), args)


def _duration_arg(name: str, text: str) -> float:
    from ntfy_intake.rules.durations import parse_duration  # noqa: PLC0415

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigError(name, str(exc)) from exc


def _serve_on_port(what: str, host: str, port: int, serve: Callable[[], None]) -> int:
    """Run a foreground server; a port that cannot be bound is one line and exit 2."""
    try:
        serve()
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise
        cause = {
            errno.EADDRINUSE: "is already in use",
            errno.EACCES: "needs privileges this user does not have",
            errno.EADDRNOTAVAIL: "is not an address of this machine",
        }[exc.errno]
        subject = f"address {host}" if exc.errno == errno.EADDRNOTAVAIL else f"port {port}"
        print(
            f"{what}: cannot listen on {host}:{port}: {subject} {cause}; "
            "choose another with --port (or --host)",
            file=sys.stderr,
        )
        return 2
    return 0


def _emulator_tokens(specs: Sequence[str]) -> dict[str, list[str]] | None:
    if not specs:
        return None
    tokens: dict[str, list[str]] = {}
    for spec in specs:
        token, _, topics = spec.partition("=")
        tokens[token] = [t.strip() for t in topics.split(",") if t.strip()] if topics else ["*"]
    return tokens


def _cmd_emulator(args: argparse.Namespace) -> int:
    from ntfy_intake.testbed.emulator import EmulatorConfig, serve_forever  # noqa: PLC0415

    try:
        config = EmulatorConfig(
            keepalive_interval=_duration_arg("--keepalive", args.keepalive),
            cache_duration=_duration_arg("--cache-duration", args.cache_duration),
            tokens=_emulator_tokens(args.token),
            request_limit=not args.no_rate_limits,
            subscription_limit=None if args.no_rate_limits else 30,
        )
    except ValueError as exc:
        raise ConfigError("--token", str(exc)) from None
    return _serve_on_port(
        "ntfy-intake emulator",
        args.host,
        args.port,
        lambda: serve_forever(args.host, args.port, config),
    )


def default_receiver_db(environ: Mapping[str, str]) -> Path:
    """Receipts live in the user's state directory, never in whatever directory we run from."""
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ntfy-intake" / "receiver.sqlite3"


def _cmd_receiver(args: argparse.Namespace) -> int:
    from ntfy_intake import settings  # noqa: PLC0415
    from ntfy_intake.testbed import receiver  # noqa: PLC0415
    from ntfy_intake.wire import signing  # noqa: PLC0415

    allow = args.allow_insecure_permissions
    secret = settings.secret_from(
        "--secret-file", args.secret_file, "NTFY_INTAKE_RELAY_SECRET", os.environ, allow=allow
    )
    token = settings.secret_from(
        "--token-file", args.token_file, "NTFY_INTAKE_RELAY_TOKEN", os.environ, allow=allow
    )
    try:
        key = None if secret is None else signing.parse_secret(secret)
    except signing.SecretError as exc:
        raise ConfigError("relay.secret", f"not a Standard Webhooks secret: {exc}") from None
    db_path: Path = args.db or default_receiver_db(os.environ)
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError("--db", f"cannot create {db_path.parent}: {exc.strerror}") from None
    return _serve_on_port(
        "ntfy-intake receiver",
        args.host,
        args.port,
        lambda: receiver.serve(args.host, args.port, db_path, secret=key, token=token),
    )


def _cmd_signal_standin(args: argparse.Namespace) -> int:
    from ntfy_intake.testbed import signal_standin  # noqa: PLC0415

    return _serve_on_port(
        "ntfy-intake signal-standin",
        args.host,
        args.port,
        lambda: signal_standin.serve(args.host, args.port),
    )


def _cmd_drill(args: argparse.Namespace) -> int:
    if args.faults == "storage":
        from ntfy_intake.testbed import drill_storage  # noqa: PLC0415

        return drill_storage.main(args)
    from ntfy_intake.testbed import drill  # noqa: PLC0415

    return drill.main(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from ntfy_intake.testbed import demo  # noqa: PLC0415

    return demo.run(extra_alerts=args.alerts)
