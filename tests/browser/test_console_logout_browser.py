"""Logging out of the console in a real browser (DESIGN.md section 10, turn 4): a POST that
carries the session's CSRF token, from the nav's button; a GET of /console/logout (a link, an
image another page embeds) logs nobody out."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

if not Path("/usr/bin/chromium").exists():
    # test_console_browser skips itself (fails under CI=true) before it defines what is imported
    # below: skip here too, naming why, rather than erroring on a half-imported module.
    pytest.skip("no /usr/bin/chromium: apt-get install chromium", allow_module_level=True)

from .test_console_browser import browser, daemon, emu, log_in, new_page  # noqa: F401


def test_a_get_of_logout_keeps_the_session_and_the_nav_button_posts_the_logout(
    browser: Any,  # noqa: F811
    daemon: tuple[str, Path],  # noqa: F811
) -> None:
    """Failure mode: logout was a GET without CSRF, so any page the owner opened could log them
    out with <img src="http://127.0.0.1:8788/console/logout">."""
    base, _ = daemon
    page = new_page(browser)
    log_in(page, base)
    # What a hostile page's <img> or link would do: a GET in the owner's browser.
    page.goto(base + "/console/logout")
    assert page.get_by_role("button", name="Log out").count() >= 1
    page.goto(base + "/console/")
    assert page.url.endswith("/console/"), page.url  # still logged in
    assert page.locator("h1").inner_text() == "Overview"
    # The nav's Log out: a form posting the CSRF token.
    nav = page.locator("nav form.logout")
    assert nav.get_attribute("method") == "post"
    assert nav.locator("input[name=csrf]").get_attribute("value")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        nav.get_by_role("button", name="Log out").click()
    assert answer.value.status == 303
    page.wait_for_url(re.compile(r".*/console/login$"))
    page.goto(base + "/console/")
    assert page.url.endswith("/console/login"), page.url  # logged out for good
    page.context.close()
