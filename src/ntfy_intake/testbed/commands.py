"""The test bed's subcommands: `emulator`, `receiver`, `signal-standin`, `drill`, `demo`.

`ntfy_intake.cli` builds the product's commands and hands `register` its `add` so these stand in
the same `ntfy-intake` help; the product never imports the test bed at module level
(tests/unit/test_layout.py). Each command imports its tool when it runs, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ntfy_intake.errors import ConfigError
from ntfy_intake.testbed import drill_args

Command = Callable[[argparse.Namespace], int]
Add = Callable[[str, Command, str], argparse.ArgumentParser]

# Default ports of the loopback test bed. The emulator stays off 8080, the usual port of
# signal-cli-rest-api, so both can run on one machine as the docs show.
EMULATOR_PORT = 8786
RECEIVER_PORT = 8790
SIGNAL_STANDIN_PORT = 8791


def register(add: Add) -> None:
    """Add the test bed's subcommands through the CLI's `add(name, command, help)`."""
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
    drill_args.add_arguments(p)

    p = add("demo", _cmd_demo, "zero-setup end-to-end demo on loopback, in a temp dir")
    p.add_argument("--alerts", type=int, default=0, help="extra generated alerts to publish")


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
