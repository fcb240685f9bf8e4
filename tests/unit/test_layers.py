"""The package's rooms import downwards only (docs/design.md, "Rooms"); hooks/ knows neither ORT nor DeepSpeed.

Imports inside functions count: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ort_zero

PACKAGE = Path(ort_zero.__file__).parent
LAYERS = [  # lowest first; a room imports its own layer's rooms or lower ones, never higher
    {"foreign", "python_op", "settings", "patching", "declaration", "restarts", "configs"},
    {"hooks", "stack"},
    {"zero3"},
    {"ort"},
    {"patches", "ort_import", "api", "distributed", "sigterm", "disk_space"},
    {"integrations"},
    {"cli", "examples", "tools", "models", "data"},  # front ends: nothing below imports them
    {"__init__"},
]
LAYER_OF = {room: index for index, rooms in enumerate(LAYERS) for room in rooms}


def room_of(path: Path) -> str:
    return path.relative_to(PACKAGE).with_suffix("").parts[0]


def imported_rooms(path: Path) -> dict[str, int]:
    """ort_zero rooms (and top-level foreign packages) `path` imports, with a line of each."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[: len(package) - node.level + 1])
            parts = base + (node.module.split(".") if node.module else [])
            targets = [parts + [alias.name] for alias in node.names] if len(parts) == 1 else [parts]
            for target in targets:
                found.setdefault(target[1], node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            found.setdefault(parts[1] if parts[0] == "ort_zero" and len(parts) > 1 else parts[0], node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found.setdefault(parts[1] if parts[0] == "ort_zero" and len(parts) > 1 else parts[0], node.lineno)
    return found


def test_every_room_has_a_layer() -> None:
    rooms = {room_of(path) for path in PACKAGE.rglob("*.py")}
    assert rooms <= set(LAYER_OF), rooms - set(LAYER_OF)


def test_rooms_import_downwards() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        room = room_of(path)
        for target, line in imported_rooms(path).items():
            if target in LAYER_OF and target != room and LAYER_OF[target] > LAYER_OF[room]:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} ({room}) imports {target}")
    assert upward == [], "\n".join(upward)


def test_hooks_know_neither_ort_nor_deepspeed() -> None:
    reaches = [
        f"{path.relative_to(PACKAGE)}:{line} imports {target}"
        for path in (PACKAGE / "hooks").rglob("*.py")
        for target, line in imported_rooms(path).items()
        if target in {"onnx", "onnxruntime", "deepspeed"}
    ]
    assert reaches == [], "\n".join(reaches)


def test_the_scan_sees_imports_across_rooms() -> None:
    """Not blind: it sees zero3's bridges import hooks and ort's recompute pass import zero3 (both downwards, so
    the other way round would be reported)."""
    assert "hooks" in imported_rooms(PACKAGE / "zero3" / "bridges.py")
    assert "zero3" in imported_rooms(PACKAGE / "ort" / "passes" / "recompute.py")
