"""No dead code: every public function and class at the top of an ort_zero module is used somewhere (in the package,
its tests, benchmarks, launch scripts or setup.py's entry points), not only defined."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import ort_zero

PACKAGE = Path(ort_zero.__file__).parent
REPO = PACKAGE.parent
USERS = ("ort_zero", "tests", "benchmarks", "launch")


def names_used() -> Counter[str]:
    """How often each identifier appears in the repository's Python code (definitions included)."""
    files = [path for folder in USERS for path in (REPO / folder).rglob("*.py")] + [REPO / "setup.py"]
    return Counter(word for path in files for word in re.findall(r"\b[A-Za-z_]\w*\b", path.read_text()))


def public_definitions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [(node.name, node.lineno) for node in tree.body if isinstance(node, kinds) and not node.name.startswith("_")]


def test_every_public_definition_is_used() -> None:
    used = names_used()
    definitions = [(path, name, line) for path in PACKAGE.rglob("*.py") for name, line in public_definitions(path)]
    assert len(definitions) > 300
    unused = [f"{path.relative_to(REPO)}:{line} {name}" for path, name, line in definitions if used[name] < 2]
    assert not unused, "defined and never used:\n" + "\n".join(unused)
