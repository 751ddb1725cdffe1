"""docs/architecture.md stays a true map: its rooms tables name every product module, and
every module they name exists. A module added without its line, or removed and still named,
fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "ntfy_intake"
DOC = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| `([\w/]+\.py)` \|", re.MULTILINE)


def product_modules(package: Path = PACKAGE) -> set[str]:
    """Every module of the product, as its path under the package; the test bed is not the
    product, and an empty `__init__.py` owns nothing."""
    return {
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if path.relative_to(package).parts[0] != "testbed"
        and not (path.name == "__init__.py" and not path.read_text().strip())
    }


def named_section(doc: str) -> str:
    start = doc.index("## The rooms\n")
    return doc[start : doc.index("\n## ", start + 1)]


def named_in_rooms(doc: str) -> set[str]:
    """The modules the rooms tables name: one row per module, its path first."""
    return set(ROW.findall(named_section(doc)))


def test_every_product_module_is_named_in_the_architecture_map() -> None:
    missing = sorted(product_modules() - named_in_rooms(DOC.read_text()))
    assert missing == [], f"docs/architecture.md's rooms do not name: {missing}"


def test_the_architecture_map_names_no_module_that_is_gone() -> None:
    gone = sorted(named_in_rooms(DOC.read_text()) - product_modules())
    assert gone == [], f"docs/architecture.md names modules that do not exist: {gone}"


def test_the_architecture_map_names_each_module_once() -> None:
    rows = ROW.findall(named_section(DOC.read_text()))
    twice = sorted({row for row in rows if rows.count(row) > 1})
    assert twice == [], f"docs/architecture.md has more than one row for: {twice}"


def test_the_map_check_sees_a_missing_row(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "__init__.py").write_text("")
    (tmp_path / "rules" / "cadence.py").write_text("x = 1\n")
    (tmp_path / "rules" / "newcomer.py").write_text("x = 1\n")
    (tmp_path / "testbed").mkdir()
    (tmp_path / "testbed" / "demo.py").write_text("x = 1\n")
    doc = "## The rooms\n\n| Module | Owns |\n|---|---|\n| `rules/cadence.py` | cadence |\n\n## Next\n"
    assert product_modules(tmp_path) - named_in_rooms(doc) == {"rules/newcomer.py"}
