"""The DeepSpeed and accelerate configs ort_zero ships, found through the installed package.

They live in `ort_zero/ds_configs/` (the checkout's top-level `ds_configs/` points there, where users copy them from)
and ship in the wheel as package data, so the tools and examples find them from any directory of an environment
where ort_zero is installed, checkout or not.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

FOLDER = "ds_configs"


def folder() -> Path:
    """Where the installed ort_zero keeps its configs."""
    return Path(str(resources.files("ort_zero") / FOLDER))


def shipped(name: str) -> Path:
    """The shipped config `name` (e.g. `zero3_hf_auto.json`)."""
    path = folder() / name
    if not path.is_file():
        raise FileNotFoundError(f"ort_zero ships no config {name!r}; it ships {', '.join(names())}")
    return path


def names() -> list[str]:
    """The shipped configs' file names."""
    return sorted(p.name for p in folder().iterdir() if p.suffix in (".json", ".yaml"))


def resolve(argument: str | Path) -> Path:
    """A config named on a command line: the file it names, or, where there is none, the shipped config of that name
    (`ds_configs/zero3_hf_auto.json` or `zero3_hf_auto.json` run from a directory without the checkout)."""
    path = Path(argument)
    if path.exists() or path.parent.name not in ("", FOLDER):
        return path
    candidate = folder() / path.name
    return candidate if candidate.is_file() else path
