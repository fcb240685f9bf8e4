"""Outside `ort_zero/foreign/` no code reaches into another object's private names or imports a private module."""

from __future__ import annotations

import ast
from pathlib import Path

import ort_zero

PACKAGE = Path(ort_zero.__file__).parent
OWN = {"self", "cls", "ctx"}  # an object's own private names (ctx: an autograd Function's context, ort_zero's own)
ALLOWED = {"sys._getframe"}  # CPython's frame access, documented for implementations that have it


def private_reaches(path: Path) -> list[str]:
    reaches = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value.id if isinstance(node.value, ast.Name) else ast.unparse(node.value)
            if base not in OWN and f"{base}.{node.attr}" not in ALLOWED:
                reaches.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {base}.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            if any(part.startswith("_") for part in node.module.split(".")):
                reaches.append(f"{path.relative_to(PACKAGE)}:{node.lineno} from {node.module}")
    return reaches


def test_private_names_of_other_packages_are_reached_only_through_ort_zero_foreign() -> None:
    files = [path for path in PACKAGE.rglob("*.py") if "foreign" not in path.relative_to(PACKAGE).parts]
    assert len(files) > 40
    reaches = [reach for path in files for reach in private_reaches(path)]
    assert reaches == [], "\n".join(reaches)


def test_the_check_finds_a_reach() -> None:
    """The scan is not blind: the fence modules themselves reach, and it sees them."""
    assert private_reaches(PACKAGE / "foreign" / "onnxruntime.py")
    assert private_reaches(PACKAGE / "foreign" / "deepspeed.py")
