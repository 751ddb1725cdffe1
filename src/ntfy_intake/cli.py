"""`ntfy-intake`: the command line. The only reader of sys.argv; maps errors to exit codes.

Exit codes: 0 ok, 1 unhealthy / failed, 2 bad configuration or usage (one line naming the key),
or an environment that cannot work (a port in use, an unusable state directory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
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

    p = add("store", _cmd_store, "move the state into PostgreSQL (store copy); store repage")
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

    # The test bed's commands (emulator, receiver, signal-standin, drill, demo) are its own: they
    # are registered here, last, so the help lists them after the product's commands.
    from ntfy_intake.testbed import commands  # noqa: PLC0415

    commands.register(add)
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
    if redriven:  # the daemon on this host looks at once (else its poll finds them)
        from ntfy_intake.flow import relay_wakeup  # noqa: PLC0415

        relay_wakeup.nudge(settings.state.dir)
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
    if args.store_command == "repage":
        return store_cli.repage(settings, lock)
    return store_cli.run(settings, store_cli.target_dsn(args), lock)


def _cmd_silence(args: argparse.Namespace) -> int:
    return silence_cli.run(_load_settings(args, need_ntfy=False), args)
