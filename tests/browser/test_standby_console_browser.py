"""A standby's console in a real browser (DESIGN.md section 9): two `ntfy-intake run` nodes on
one PostgreSQL store, the standby's pages opened in Chromium on a phone's width in dark mode."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ntfy_intake.testbed.emulator import EmulatorConfig, NtfyEmulator

from .. import harness
from ..harness import wait_until
from ..standby import Cluster, serving_as_leader, standing_by

if not Path("/usr/bin/chromium").exists():
    # test_console_browser skips itself (fails under CI=true) before it defines what is imported
    # below: skip here too, naming why, rather than erroring on a half-imported module.
    pytest.skip("no /usr/bin/chromium: apt-get install chromium", allow_module_level=True)

from .test_console_browser import PAGES, TOKEN, browser, log_in, new_page  # noqa: F401

SHOTS = os.environ.get("NTFY_INTAKE_SCREENSHOTS")  # read at import: conftest empties NTFY_INTAKE_*
LEADER_URL = "http://alpha.lan:8080"


@pytest.fixture
def standby_base(tmp_path: Path) -> Iterator[str]:
    """alpha leads with a `[cluster] url`, beta stands by: beta's console's base URL."""
    assert harness.DATABASE is not None
    with NtfyEmulator(EmulatorConfig(keepalive_interval=1.0)).running() as emu:
        cluster = Cluster(tmp_path, harness.DATABASE, emu, http_token=TOKEN)
        try:
            alpha = cluster.add("alpha", cluster_url=LEADER_URL)
            beta = cluster.add("beta")
            alpha.start()
            wait_until(lambda: serving_as_leader(alpha), 30, "alpha serving as the leader")
            beta.start()
            wait_until(lambda: standing_by(beta), 30, "beta standing by")
            yield f"http://127.0.0.1:{beta.port}"
        finally:
            cluster.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_standbys_banner_names_the_leader_on_a_phone_in_dark_mode_without_sideways_scroll(
    browser: Any,  # noqa: F811
    standby_base: str,
) -> None:
    """Failure mode: a standby's console that hides whose console acts (the banner cut off or
    pushed sideways on a phone), or posts a form to the leader (refused there: 403, CSRF)."""
    page = new_page(browser, width=390, dark=True)
    log_in(page, standby_base)
    for name in PAGES:
        page.goto(f"{standby_base}/console/{name}")
        banner = page.locator(".banner.info")
        assert banner.is_visible(), f"/console/{name}: no standby banner"
        assert re.search(r"This node is a standby\. The leader is at", banner.inner_text())
        box = banner.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
        overflow = page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"/console/{name} scrolls sideways on a standby at 390 px"
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert sum(int(v) for v in re.findall(r"\d+", background)[:3]) < 150, background
        # No form posts to the leader (its CSRF check refuses a standby's token): the only
        # form is this node's logout; each action is a link to the leader's page.
        actions = page.eval_on_selector_all("form[method=post]", "fs => fs.map(f => f.action)")
        assert [a for a in actions if not a.endswith("/console/logout")] == [], actions
        links = page.eval_on_selector_all("a.on-leader", "ls => ls.map(l => l.href)")
        assert all(link.startswith(LEADER_URL + "/console/") for link in links), links
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=f"{SHOTS}/standby-{name or 'overview'}-phone-dark.png")
    page.context.close()
