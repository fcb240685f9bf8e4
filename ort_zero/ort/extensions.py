"""Build ORTModule's torch C++ extensions for what this machine has, and check that ORTModule really runs.

ORT's own installer (`onnxruntime.training.ortmodule.torch_cpp_extensions.install`) compiles the CUDA extensions
whenever torch is a CUDA build and stops on a machine without the CUDA toolkit, which is every CPU machine with PyPI's
torch. Here the `cpu/` extensions are always built and the `cuda/` ones only where a GPU and `nvcc` exist. Built
libraries are cached under ~/.cache/ort_zero keyed on the torch/ORT versions, so a fresh venv reuses them.

    python -m ort_zero.ort.extensions ensure   # build what is missing (idempotent)
    python -m ort_zero.ort.extensions smoke    # ORTModule forward/backward, fallback disabled
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("ORT_ZERO_CACHE", Path.home() / ".cache" / "ort_zero"))


def extensions_dir() -> Path:
    """ORTModule's `torch_cpp_extensions` folder, found without importing ORTModule (which needs the extensions)."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        raise RuntimeError("onnxruntime-training is not installed")
    return Path(spec.origin).parent / "training" / "ortmodule" / "torch_cpp_extensions"


def wanted_flavours() -> list[str]:
    import torch

    flavours = ["cpu"]
    if torch.version.cuda and torch.cuda.is_available() and shutil.which("nvcc"):
        flavours.append("cuda")
    return flavours


def built_libraries(flavour: str) -> list[Path]:
    """The .so files ORTModule loads for one flavour (one per extension folder)."""
    folder = extensions_dir()
    names = [Path(setup).parent.name for setup in glob.glob(str(folder / flavour / "*" / "setup.py"))]
    return [lib for name in names for lib in folder.glob(f"{name}*.so")]


def missing_extensions(flavour: str) -> list[str]:
    folder = extensions_dir()
    names = sorted(Path(setup).parent.name for setup in glob.glob(str(folder / flavour / "*" / "setup.py")))
    return [name for name in names if not list(folder.glob(f"{name}*.so"))]


def cache_key(flavour: str) -> str:
    from importlib.metadata import version

    import torch

    python = f"{sys.version_info[0]}{sys.version_info[1]}"
    return f"{flavour}-torch{torch.__version__}-ort{version('onnxruntime-training')}-py{python}"


def build(flavour: str) -> None:
    """Compile each extension of `flavour` in a scratch copy, then place the libraries where ORTModule looks."""
    folder = extensions_dir()
    cached = CACHE_ROOT / cache_key(flavour)
    if cached.is_dir() and list(cached.glob("*.so")):
        for lib in cached.glob("*.so"):
            shutil.copy2(lib, folder / lib.name)
        print(f"[extensions] {flavour}: restored from {cached}")
        return
    env = dict(
        os.environ, ORTMODULE_TORCH_CPP_DIR=str(folder), MAX_JOBS=os.environ.get("MAX_JOBS", str(os.cpu_count()))
    )
    with tempfile.TemporaryDirectory(prefix="ort_zero_ext_") as scratch:
        for name in missing_extensions(flavour):
            source = folder / flavour / name
            work = Path(scratch) / name
            shutil.copytree(source, work)
            print(f"[extensions] building {flavour}/{name} (a few minutes on 2 cores)", flush=True)
            result = subprocess.run([sys.executable, "setup.py", "build"], cwd=work, env=env)
            if result.returncode != 0:
                raise RuntimeError(
                    f"building ORTModule's {flavour}/{name} extension failed (compiler output above). "
                    "Check that g++ works and that torch==2.6.0 is installed."
                )
            for lib in work.glob("build/lib.*/*.so"):
                shutil.copy2(lib, folder / lib.name)
    cached.mkdir(parents=True, exist_ok=True)
    for lib in built_libraries(flavour):
        shutil.copy2(lib, cached / lib.name)


def ensure() -> None:
    for flavour in wanted_flavours():
        if missing_extensions(flavour):
            build(flavour)
        print(f"[extensions] {flavour}: {', '.join(sorted(p.name for p in built_libraries(flavour)))}")


def smoke() -> None:
    """A tiny ORTModule forward/backward that must run in ORT: fallback disabled, ORT's session checked."""
    os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
    import torch
    from onnxruntime.training.ortmodule import ORTModule

    model = ORTModule(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)))
    loss = model(torch.randn(3, 4)).square().sum()
    loss.backward()
    manager = model._torch_module._execution_manager(is_training=True)
    if getattr(manager, "_execution_agent", None) is None:
        raise RuntimeError("ORTModule returned a result but no ORT session exists: it did not run in ONNX Runtime")
    print(f"[extensions] ORTModule smoke test passed in ONNX Runtime (loss {loss.item():.4f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["ensure", "smoke"])
    action = parser.parse_args(argv).action
    try:
        ensure() if action == "ensure" else smoke()
    except Exception as error:  # the bootstrap shows this line, not a traceback
        print(f"[extensions] ERROR: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
