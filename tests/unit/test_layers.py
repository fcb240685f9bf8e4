"""The package's rooms import downwards only (docs/design.md, "Rooms"); hooks/ knows neither ORT nor DeepSpeed.

Imports inside functions count: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ort_zero

PACKAGE = Path(ort_zero.__file__).parent
LAYERS = [  # lowest first; a room imports its own layer's rooms or lower ones, never higher
    {"foreign", "python_op", "settings", "patching", "patch_groups", "declaration", "restarts", "configs"},
    {"hooks", "stack", "memory"},
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


ORT_LAYERS = [  # the rooms of ort/, lowest first, as LAYERS
    {"step"},  # what ORT calls back into at step time: imports nothing else of ort/
    {"graph"},
    {"export"},  # what runs while exporting
    {"passes"},
    {"ortmodule", "inspection"},
]
ORT_LAYER_OF = {room: index for index, rooms in enumerate(ORT_LAYERS) for room in rooms}


def imported_modules(path: Path) -> dict[str, int]:
    """The ort_zero modules `path` imports (dotted, below the package: "ort.step.kernels"), with a line of each."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[: len(package) - node.level + 1]) + (node.module.split(".") if node.module else [])
            for alias in node.names:
                found.setdefault(".".join([*base[1:], alias.name]), node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ort_zero."):
            found.setdefault(node.module.removeprefix("ort_zero."), node.lineno)
    return found


def ort_room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "ort" else None


def test_ort_rooms_import_downwards() -> None:
    """ort/step holds what ORT calls back into at step time and imports no export, pass or ORTModule code."""
    upward = []
    for path in (PACKAGE / "ort").rglob("*.py"):
        room = ort_room_of(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        for module, line in imported_modules(path).items():
            target = ort_room_of(module)
            if room in ORT_LAYER_OF and target in ORT_LAYER_OF and ORT_LAYER_OF[target] > ORT_LAYER_OF[room]:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} (ort/{room}) imports ort/{target}")
    assert upward == [], "\n".join(upward)


def test_every_ort_room_has_a_layer() -> None:
    rooms = {path.relative_to(PACKAGE / "ort").with_suffix("").parts[0] for path in (PACKAGE / "ort").glob("*")}
    assert rooms - {"__init__", "__pycache__"} <= set(ORT_LAYER_OF), rooms - set(ORT_LAYER_OF)


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
    attention = imported_modules(PACKAGE / "ort" / "step" / "torch_kernels" / "attention.py")
    assert any(module.startswith("ort.step.kept_graph.") for module in attention)
    assert "ort.step.python_ops.Exponential" in imported_modules(PACKAGE / "ort" / "export" / "python_ops.py")
