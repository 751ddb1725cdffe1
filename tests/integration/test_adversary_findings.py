"""Defects found by trying to break issue 32's work as an operator running two Pis would (the
adversary's pass, 2026-12-06). Each test is the finding's reproduction, marked xfail(strict):
it fails on today's code, and the fix flips it (strict: then the mark must go)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from .. import ports
from ..harness import DaemonThread, settings_for, wait_until

_closed_port = ports.free_port


def _check(tmp_path: Path, database: str) -> subprocess.CompletedProcess[str]:
    """`ntfy-intake check` (docker's health check) on a config naming `database`."""
    config = tmp_path / "config.toml"
    config.write_text(
        "[ntfy]\n"
        'url = "http://127.0.0.1:1"\n'
        'topics = ["alerts"]\n'
        "[state]\n"
        f"dir = {json.dumps(str(tmp_path / 'state'))}\n"
        f"database = {json.dumps(database)}\n"
    )
    config.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NTFY_INTAKE_")}
    return subprocess.run(
        [sys.executable, "-m", "ntfy_intake", "check", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# A password holding a double quote next to a character libpq stumbles on. libpq quotes the
# text it stumbled on ("..."), and settings/dsn.py cuts quoted parts with "[^"]*": a `"` inside
# the password ends the cut early, and the rest of the password is printed.
QUOTED_PASSWORDS = [
    ("uri_percent", 'postgresql://intake:Kx9"Zq%zzWm4Lp7@127.0.0.1:{port}/postgres'),
    ("uri_ipv6", 'postgresql://intake:Kx9"ZqWm4Lp7@[::1:{port}/postgres'),
    ("keywords_space", 'host=127.0.0.1 port={port} password=Kx9 Zq"Wm4Lp7 dbname=postgres'),
]


@pytest.mark.parametrize(
    ("form", "template"), QUOTED_PASSWORDS, ids=[f for f, _ in QUOTED_PASSWORDS]
)
def test_check_never_prints_a_piece_of_a_password_holding_a_double_quote(
    form: str, template: str, tmp_path: Path
) -> None:
    """Seen: `config error: state.database: libpq: invalid percent-encoded token (not
    shown)Zq%zzWm4Lp7"; ...`: most of the password, in docker's health output and the log."""
    done = _check(tmp_path, template.format(port=_closed_port()))
    shown = done.stdout + done.stderr
    assert done.returncode == 2, shown
    for piece in ("Wm4Lp7", "Zq%zz", 'Kx9"Zq', "Kx9 Zq"):
        assert piece not in shown, f"{piece!r} of the password shown ({form}): {shown}"


# -- the throttle: one client's success forgives another's guesses on the same address ---------------

TOKEN = "adversary-surface-token-7Hq2Xv9Lp4"
ROUNDS = 40


def test_an_agent_s_successful_polls_do_not_reset_a_guesser_s_count_on_the_same_address(
    tmp_path: Path,
) -> None:
    """rules/login_throttle.py: "a few typos, then the right token: forgiven" deletes the
    address's bucket on any success before a hold. Every loopback address is one client, and
    so is everyone behind one NAT; an agent on the box polls its feed with the right token
    (every few seconds, or a long poll), so a local process (or a neighbour behind the NAT)
    that sends 4 guesses after each agent request is never held: here 40 agent requests let
    160 wrong tokens be compared, no 429 and no owner notice, against the contract's 5 then
    one per hold (docs/console.md). In an hour of an agent polling every 10 s: 1,440 guesses
    checked (the pure model, /tmp/adversary/bypass.py). A fast guesser the other way round
    holds the agent out (1 of 360 polls answered in that hour): loopback is one bucket."""
    with NtfyEmulator(EmulatorConfig(keepalive_interval=0.5)).running() as emu:
        config = settings_for(emu.url, tmp_path / "state", http_token=TOKEN)
        with DaemonThread(config) as running:
            wait_until(lambda: running.daemon is not None and running.daemon.http_port)
            assert running.daemon is not None
            base = f"http://127.0.0.1:{running.daemon.http_port}"
            checked_wrong = held = 0
            with httpx.Client(base_url=base, timeout=10) as client:
                for i in range(ROUNDS):
                    agent = {"Authorization": f"Bearer {TOKEN}"}
                    client.get("/v1/feed/agent", headers=agent)  # the agent's poll
                    for j in range(4):  # the guesser, same address (loopback)
                        guess = {"Authorization": f"Bearer guess-{i:03d}-{j}-XvQ9"}
                        code = client.get("/v1/feed/agent", headers=guess).status_code
                        checked_wrong += code == 403
                        held += code == 429
    print(f"\n{ROUNDS} agent polls: {checked_wrong} wrong tokens compared, {held} held (429)")
    # The contract: 5 wrong tokens, then the address is held and one is checked per hold.
    assert checked_wrong <= 10, f"{checked_wrong} guesses compared, never held"


# -- the shipped two-box compose files against the work fingerprint -------------------------------


def test_the_shipped_two_box_compose_configs_have_one_work_fingerprint(tmp_path: Path) -> None:
    """deploy/compose.config.toml (box 1, `docker compose -f compose.yaml -f deploy/
    compose.cluster.yaml`) reaches ntfy as `http://ntfy:80` (the compose service) and the agent
    as `http://host.docker.internal:8790/triage`; deploy/compose.standby.config.toml (box 2)
    reaches the same two as `http://box1.lan:8080` and `http://agent.lan:8790/triage`, as its
    comments say it must. The work fingerprint is of the URL text (rules/readiness.
    work_address), so box 2 started next to a live box 1 exits 2 ("this node's work differs
    from the leader's (node 'box1') in ntfy.url, relay.url"), and compose restarts it into the
    same exit: the shipped standby never stands by. test_deploy_files compares topics,
    cadence and recipients, never the fingerprint."""
    from ntfy_intake import settings  # noqa: PLC0415
    from ntfy_intake.rules import readiness  # noqa: PLC0415
    from ntfy_intake.runtime.readiness import parts_of  # noqa: PLC0415

    from .test_deploy_files import COMPOSE_CONFIG, STANDBY_CONFIG, _secret_files  # noqa: PLC0415

    environ = _secret_files(tmp_path)
    box1 = settings.load(COMPOSE_CONFIG, {**environ, "NTFY_INTAKE_CLUSTER_NODE": "box1"})
    box2 = settings.load(STANDBY_CONFIG, {**environ, "NTFY_INTAKE_CLUSTER_NODE": "box2"})
    keys = readiness.differing(parts_of(box1, {}), parts_of(box2, {}))
    assert keys == [], f"box 2 would exit 2 next to box 1: work differs in {keys}"
