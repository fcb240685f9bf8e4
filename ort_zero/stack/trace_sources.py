"""ort_zero's own C++ callback for TorchScript's tracer (`csrc/trace_sources.cpp`), built like ORTModule's
extensions: by `python -m ort_zero.stack.extensions ensure` (the bootstrap), cached under ~/.cache/ort_zero keyed on
torch's version and the source's text. Without it, exports record torch's full source locations (slower, the same
graph): `ort-zero doctor` says which."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from .cache import cache_root

SOURCE = Path(__file__).parent / "csrc" / "trace_sources.cpp"
NAME = "ort_zero_trace_sources"


def build_directory() -> Path:
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    python = f"{sys.version_info[0]}{sys.version_info[1]}"
    return cache_root() / f"trace_sources-torch{torch.__version__}-py{python}-{digest}"


def library() -> Path | None:
    """The built library for the installed torch and this source, or None when it has not been built."""
    built = build_directory() / f"{NAME}.so"
    return built if built.is_file() else None


def ensure() -> Path:
    """Build the library when this torch and source have none yet; returns it."""
    built = library()
    if built is not None:
        return built
    from torch.utils import cpp_extension

    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    print(f"[extensions] building ort_zero's tracer callback ({SOURCE.name})", flush=True)
    cpp_extension.load(
        name=NAME, sources=[str(SOURCE)], build_directory=str(directory), extra_cflags=["-O2"],
        is_python_module=False, verbose=False,
    )  # fmt: skip
    built = library()
    if built is None:
        raise RuntimeError(f"building {SOURCE} left no {NAME}.so in {directory} (compiler output above)")
    return built
