"""The `drill` command's arguments, kept apart so every other command starts without importing
the drill (the emulator, the receiver and httpx)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kills", type=int, default=20, help="kill -9s in total, random and at crash points"
    )
    parser.add_argument("--seed", type=int, default=None, help="fixes the plan (default: random)")
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="spread the plan over about this long (default: 0.3-1.5 s per daemon lifetime)",
    )
    parser.add_argument(
        "--ntfy-url", default=None, help="a real ntfy server instead of the emulator"
    )
    parser.add_argument(
        "--topic", default=None, help="the test topic on --ntfy-url (it gets spammed)"
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="ntfy access token for --ntfy-url, read from this file (0600); or set "
        "NTFY_INTAKE_NTFY_TOKEN or NTFY_INTAKE_NTFY_TOKEN_FILE (never on the command line)",
    )
    parser.add_argument(
        "--allow-insecure-permissions",
        action="store_true",
        help="accept a token file that group or others can read (not advised)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temp dir (state, audit log, daemon.log)"
    )
    parser.add_argument(
        "--database",
        default=None,
        metavar="DSN",
        help="run the daemon on PostgreSQL (NTFY_INTAKE_STATE_DATABASE), in a fresh schema of the"
        " drill's own inside this database, dropped at the end (default: SQLite in the temp dir)",
    )
    parser.add_argument(
        "--pg-data",
        type=Path,
        default=None,
        metavar="DIR",
        help="--faults storage or --standby, with --database: the server's data dir, for the"
        " immediate restart fault (pg_ctl -m immediate restart, as the dir's owner); without it"
        " that fault is"
        " skipped. Never a server others rely on",
    )
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument(
        "--faults",
        choices=("kill", "storage"),
        default="kill",
        help="kill: kill -9 and crash points (default); storage: disk full, RLIMIT_FSIZE, audit"
        " file deleted, database deleted, write lock held, clock jumps; with --database also"
        " pg_terminate_backend of the daemon's sessions and an immediate server restart",
    )
    kind.add_argument(
        "--standby",
        dest="faults",
        action="store_const",
        const="standby",
        help="two nodes (pi, nas) on one PostgreSQL (--database), --rounds faults against the"
        " leader: kill -9, SIGSTOP past the lease, pg_terminate_backend, an immediate server"
        " restart (with --pg-data), SIGTERM, and the work's: its route to ntfy cut, its audit"
        " directory full, its ntfy stream silent; failover times and the standby's verdict",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=20,
        help="--faults storage: faults of each kind; --standby: fault rounds in all (default 20)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="--standby: the nodes' [cluster] lease_ttl (default 3)",
    )
    parser.add_argument(
        "--renew-every",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="--standby: the nodes' [cluster] renew_every (default 1)",
    )
    parser.add_argument(
        "--kinds",
        default=None,
        metavar="KIND,...",
        help="--standby: only these fault kinds (kill9, sigstop, pg_terminate, pg_restart, sigterm,"
        " route_cut, audit_full, stream_silent; default: all)",
    )
    parser.add_argument(
        "--yield-after",
        type=float,
        default=4.0,
        metavar="SECONDS",
        help="--standby: the nodes' [cluster] yield_after (default 4; the daemon's own is 60)",
    )
    parser.add_argument(
        "--probe-every",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="--standby: the nodes' [cluster] probe_every (default 1; the daemon's own is 10)",
    )
    parser.add_argument(
        "--yield-cooloff",
        type=float,
        default=None,
        metavar="SECONDS",
        help="--standby: the nodes' [cluster] yield_cooloff (default: the larger of 10 and twice"
        " --yield-after; the daemon's own is 300)",
    )
