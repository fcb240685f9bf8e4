"""The README and docs/ name files and modules that exist: a file moved or renamed is a stale sentence until every
page that names it follows."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILE = re.compile(r"\b(?:ort_zero|tests|benchmarks|launch)/[\w/.-]+\.(?:py|sh|json)\b")
MODULE = re.compile(r"\bort_zero(?:\.\w+)+")


def _named(pattern: re.Pattern) -> list[tuple[str, str]]:
    return [(page.name, name) for page in PAGES for name in sorted(set(pattern.findall(page.read_text())))]


def _is_module_or_member(dotted: str) -> bool:
    """`ort_zero.a.b` is a module (file or package), or a name its parent module defines or imports."""
    path = ROOT / Path(*dotted.split("."))
    if path.with_suffix(".py").exists() or path.is_dir():
        return True
    parent = next((p for p in (path.parent.with_suffix(".py"), path.parent / "__init__.py") if p.exists()), None)
    return parent is not None and re.search(rf"\b{path.name}\b", parent.read_text()) is not None


def test_every_file_a_page_names_exists() -> None:
    missing = [f"{page}: {name}" for page, name in _named(FILE) if not (ROOT / name).exists()]
    assert missing == [], missing


def test_every_module_a_page_names_exists() -> None:
    missing = [f"{page}: {name}" for page, name in _named(MODULE) if not _is_module_or_member(name)]
    assert missing == [], missing


def test_the_scan_sees_names() -> None:
    assert ("design.md", "ort_zero/zero3/state.py") in _named(FILE)
    assert not _is_module_or_member("ort_zero.zero3.no_such_module.thing")
    assert not _is_module_or_member("ort_zero.zero3.no_such_module")  # a package's member it does not have
