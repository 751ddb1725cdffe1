"""The differential test: one scripted session against the emulator and the real ntfy server; the
normalized transcripts must be equal. docs/emulator.md's fidelity table comes from this run.

The comparison can fail: with the emulator's `since=<id>` made inclusive (its test-only fault
`misbehave_inclusive_since_id`), the transcripts differ and the matching conformance item fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..servers import start
from . import test_both_servers as conformance
from .transcript import Step, record_session


def differences(left: list[Step], right: list[Step]) -> list[str]:
    out = []
    for (name, a), (other, b) in zip(left, right, strict=True):
        assert name == other
        if a != b:
            out.append(f"{name}:\n  emulator: {a}\n  real:     {b}")
    return out


@pytest.mark.real_ntfy
def test_emulator_and_real_server_transcripts_are_equal(tmp_path: Path) -> None:
    with start("emulator", tmp_path / "e") as emulator:
        emulated = record_session(emulator.url)
    with start("real", tmp_path / "r") as real:
        observed = record_session(real.url)
    assert len(emulated) == len(observed) > 40
    assert differences(emulated, observed) == []


def test_transcript_is_deterministic_on_one_server(tmp_path: Path) -> None:
    """Normalization removes ids and times, nothing else: two runs give the same transcript."""
    with start("emulator", tmp_path / "a") as one, start("emulator", tmp_path / "b") as two:
        assert record_session(one.url) == record_session(two.url)


def test_an_inclusive_since_id_in_the_emulator_fails_the_comparison(tmp_path: Path) -> None:
    with start("emulator", tmp_path / "good") as good:
        reference = record_session(good.url)
    with start("emulator", tmp_path / "bad") as bad:
        assert bad.emulator is not None
        bad.emulator.faults.misbehave_inclusive_since_id()
        mutated = record_session(bad.url)
        with pytest.raises(AssertionError):
            conformance.test_item13_14_since_id_is_exclusive_and_looked_up_across_topics(bad)
    found = differences(mutated, reference)
    assert any(line.startswith("since first id:") for line in found), found
