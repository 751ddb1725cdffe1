"""Refused subscribes (refusals.py): only 40008 concerns the cursor; 401s spend ntfy's
authentication budget, 403s do not; one report per kind per episode."""

from __future__ import annotations

from ntfy_intake.wire import refusals
from ntfy_intake.wire.refusals import AUTH_BACKOFF, Episodes, StatusFailure


def failure(
    status: int, code: int | None = None, retry_after: float | None = None
) -> StatusFailure:
    return StatusFailure(status, retry_after, code, "some error")


def test_third_consecutive_401_waits_at_least_five_minutes() -> None:
    episodes = Episodes()
    waits = [episodes.refused(failure(401, 40101))[0] for _ in range(4)]
    assert waits[:2] == [None, None]
    assert waits[2] == waits[3] == AUTH_BACKOFF


def test_403_neither_spends_nor_resets_the_authentication_budget() -> None:
    episodes = Episodes()
    episodes.refused(failure(401))
    episodes.refused(failure(401))
    for _ in range(5):
        assert episodes.refused(failure(403, 40301))[0] is None
    assert episodes.refused(failure(401))[0] == AUTH_BACKOFF


def test_an_open_subscription_resets_the_401_count_and_starts_a_new_episode() -> None:
    episodes = Episodes()
    _, first = episodes.refused(failure(401))
    _, again = episodes.refused(failure(401))
    episodes.connected()
    wait, after = episodes.refused(failure(401))
    assert first is not None and again is None and after is not None
    assert wait is None and first.episode != after.episode


def test_each_kind_is_reported_once_per_episode_and_named() -> None:
    episodes = Episodes()
    kinds = [
        report.category
        for status, code in [(429, 42903), (429, 42909), (403, 40301), (400, 40009), (503, None)]
        if (report := episodes.refused(failure(status, code))[1]) is not None
    ]
    assert kinds == ["rate_limit", "acl", "rejected"]  # 503 is server trouble: no report


def test_42909_locked_out_waits_at_least_a_minute_and_retry_after_is_kept() -> None:
    assert Episodes().refused(failure(429, 42909))[0] == refusals.AUTH_LOCKED_BACKOFF
    assert Episodes().refused(failure(429, 42901, retry_after=7.0))[0] == 7.0


def test_error_bodies_parse_to_code_and_text_or_fall_back_to_the_text() -> None:
    body = '{"code":40009,"http":400,"error":"invalid request: topic invalid"}\n'
    assert refusals.parse_error_body(body) == (40009, "invalid request: topic invalid")
    assert refusals.parse_error_body("<html>bad gateway</html>") == (
        None,
        "<html>bad gateway</html>",
    )
    assert refusals.parse_error_body('{"code":true}') == (None, '{"code":true}')
    assert refusals.describe_error_body(body) == "40009: invalid request: topic invalid"
