"""The instance prefix a crashed predecessor is known by (runtime/cluster.directory_prefix): the
state directory's random prefix AND where that directory is in this boot. A copy of the
directory (a cloned SD card, `cp -a`) carries the random prefix but is somewhere else, or on
another boot: its processes are no predecessors of this one's, their lease is waited out."""

from __future__ import annotations

import shutil
from pathlib import Path

from ntfy_intake.runtime.cluster import PREFIX_FILE, directory_prefix


def boot(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"boot-{text[:8]}"
    path.write_text(text + "\n")
    return path


BOOT_A = "107a9f0f-b7e9-41ef-b975-79c70787a630"
BOOT_B = "5d0c1e2f-0a1b-4c2d-9e8f-112233445566"


def test_the_same_directory_in_the_same_boot_is_its_own_predecessor(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    first = directory_prefix(state, boot(tmp_path, BOOT_A))
    assert directory_prefix(state, boot(tmp_path, BOOT_A)) == first  # a restart after a crash


def test_a_copied_state_directory_is_no_predecessor(tmp_path: Path) -> None:
    state, clone = tmp_path / "state", tmp_path / "clone"
    state.mkdir()
    original = directory_prefix(state, boot(tmp_path, BOOT_A))
    shutil.copytree(state, clone)  # the prefix file comes along, as on a cloned SD card
    assert (clone / PREFIX_FILE).read_text() == (state / PREFIX_FILE).read_text()
    copied = directory_prefix(clone, boot(tmp_path, BOOT_A))
    assert copied.split(".")[0] == original.split(".")[0]
    assert not copied.startswith(original) and not original.startswith(copied)


def test_the_same_directory_on_another_boot_is_no_predecessor(tmp_path: Path) -> None:
    """A cloned card on another box may even have the same inode; its boot id differs."""
    state = tmp_path / "state"
    state.mkdir()
    here = directory_prefix(state, boot(tmp_path, BOOT_A))
    there = directory_prefix(state, boot(tmp_path, BOOT_B))
    assert here != there and not there.startswith(here)


def test_without_a_boot_id_no_process_is_taken_for_a_predecessor(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    missing = tmp_path / "no-boot-id"
    assert directory_prefix(state, missing) != directory_prefix(state, missing)
