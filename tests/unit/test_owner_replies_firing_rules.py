"""Which firing a reply acts on (rules/owner_replies.firing_over, ack_refused): pure.

Each test is named after the failure it kills.
"""

from __future__ import annotations

import pytest

from ntfy_intake.rules import owner_replies as r


@pytest.mark.parametrize(
    ("shown", "status", "version", "over"),
    [
        (1, "firing", 1, False),  # the firing the message showed
        (1, "resolved", 2, False),  # it resolved: still that firing (its ack holds until...)
        (1, "firing", 3, True),  # ...it fires again
        (1, "firing", 2, True),  # its severity rose
        (2, "resolved", 2, False),  # a message sent once it had resolved
        (2, "firing", 3, True),  # and the next firing
        (None, "firing", 9, False),  # sent before versions were kept: acts as before
    ],
)
def test_firing_over_is_the_end_of_an_ack_given_when_the_message_went_out(
    shown: int | None, status: str, version: int, over: bool
) -> None:
    """Failure mode: a reply to a message about an ended firing acknowledges the one on now
    (or one about the firing on now is refused)."""
    assert r.firing_over(shown, status, version) is over


def test_refusal_says_nothing_was_acknowledged_and_how_to_ack_the_firing_on_now() -> None:
    quoted = r.ack_refused("alerts:disk", "quote")
    newest = r.ack_refused("alerts:disk", "newest")
    for words in (quoted, newest):
        assert words.startswith("alerts:disk fired again (or got worse) since ")
        assert "nothing was acknowledged" in words
        assert len(words) <= r.CONFIRMATION_LIMIT
    assert "the message you quoted" in quoted and "the newer message about it" in quoted
    assert "my newest message" in newest and "when it comes" in newest


def test_refusal_keeps_a_hostile_incident_name_on_one_bounded_line() -> None:
    words = r.ack_refused("alerts:x\n\x1b[2Jfake " + "y" * 500, "quote")
    assert "\n" not in words and "\x1b" not in words
    assert len(words) < 400


def test_silence_of_an_ended_firing_says_what_it_covers() -> None:
    plain = r.confirmation("silence", "alerts:disk", until="2026-12-06 23:00 UTC")
    again = r.confirmation("silence", "alerts:disk", until="2026-12-06 23:00 UTC", fired_again=True)
    assert plain == "Silenced alerts:disk until 2026-12-06 23:00 UTC."
    assert again.startswith(plain + " It fired again (or got worse) since that message")
