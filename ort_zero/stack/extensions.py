"""Build ORTModule's torch C++ extensions for what this machine has, and check that ORTModule really runs.

ORT's own installer (`onnxruntime.training.ortmodule.torch_cpp_extensions.install`) compiles the CUDA extensions
whenever torch is a CUDA build and stops at the first failure: `fused_ops` needs `nvcc`, which PyPI's CUDA 12 torch
does not bring. Here the `cpu/` extensions are always built; on GPU hosts (or with ORT_ZERO_CUDA=1) also
`torch_gpu_allocator`, which ORTModule imports whenever CUDA is available: it is plain C++, compiled by g++ against a
CUDA_HOME assembled from torch's nvidia-*-cu12 wheels. `fused_ops` is never built (it only serves
`onnxruntime.training.optim`'s FusedAdam and FP16_Optimizer). Built libraries are cached under ~/.cache/ort_zero
keyed on the torch/ORT versions, so a fresh venv reuses them. ort_zero's own tracer callback (`trace_sources`) is
built beside them.

    python -m ort_zero.stack.extensions ensure   # build what is missing (idempotent)
    python -m ort_zero.stack.extensions smoke    # ORTModule forward/backward, fallback disabled
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import cuda_libraries, extension_sources, trace_sources
from .cache import cache_root


def extensions_dir() -> Path:
    """ORTModule's `torch_cpp_extensions` folder, found without importing ORTModule (which needs the extensions)."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        raise RuntimeError("onnxruntime-training is not installed")
    return Path(spec.origin).parent / "training" / "ortmodule" / "torch_cpp_extensions"


# The CUDA extensions that build without nvcc; fused_ops (.cu sources) is left out on purpose.
CUDA_WITHOUT_NVCC = ("torch_gpu_allocator",)


def wanted_flavours() -> list[str]:
    import torch

    flavours = ["cpu"]
    if torch.version.cuda and cuda_libraries.wanted():
        flavours.append("cuda")
    return flavours


def extension_names(flavour: str) -> list[str]:
    names = sorted(Path(setup).parent.name for setup in glob.glob(str(extensions_dir() / flavour / "*" / "setup.py")))
    return [name for name in names if flavour != "cuda" or name in CUDA_WITHOUT_NVCC]


def built_libraries(flavour: str) -> list[Path]:
    """The .so files ORTModule loads for one flavour (one per extension folder)."""
    return [lib for name in extension_names(flavour) for lib in extensions_dir().glob(f"{name}*.so")]


def missing_extensions(flavour: str) -> list[str]:
    return [name for name in extension_names(flavour) if not list(extensions_dir().glob(f"{name}*.so"))]


def cache_key(flavour: str) -> str:
    from importlib.metadata import version

    import torch

    python = f"{sys.version_info[0]}{sys.version_info[1]}"
    return f"{flavour}-torch{torch.__version__}-ort{version('onnxruntime-training')}-py{python}-edits{edits_digest()}"


def edits_digest() -> str:
    """Changes with any edit's text, so that a changed edit rebuilds (cache key and build record)."""
    return hashlib.sha256(repr(extension_sources.EDITS).encode()).hexdigest()[:12]


def build(flavour: str) -> None:
    """Compile each extension of `flavour` in a scratch copy, then place the libraries where ORTModule looks."""
    folder = extensions_dir()
    cached = cache_root() / cache_key(flavour)
    if cached.is_dir() and list(cached.glob("*.so")):
        for built in [*cached.glob("*.so"), *cached.glob(BUILD_RECORD.format(flavour=flavour))]:
            place(built, folder / built.name)
        print(f"[extensions] {flavour}: restored from {cached}")
        return
    edits = {name: compile_extension(flavour, name, folder) for name in extension_names(flavour)}
    record = folder / BUILD_RECORD.format(flavour=flavour)
    import torch

    record.write_text(json.dumps({"torch": torch.__version__, "edits": edits, "digest": edits_digest()}, indent=1))
    cached.mkdir(parents=True, exist_ok=True)
    for built in [*built_libraries(flavour), record]:
        shutil.copy2(built, cached / built.name)


# Beside the libraries: the torch they were built against and ort_zero's source edits in them (`ort-zero doctor`).
BUILD_RECORD = "ort_zero_{flavour}_build.json"


def build_record(flavour: str) -> dict | None:
    record = extensions_dir() / BUILD_RECORD.format(flavour=flavour)
    return json.loads(record.read_text()) if record.is_file() else None


def up_to_date(flavour: str) -> bool:
    """Built for the installed torch with the edits ort_zero declares now (a changed edit or torch rebuilds)."""
    import torch

    record = build_record(flavour)
    wanted = {
        name: [edit.name for edit in extension_sources.edits_for(f"{flavour}/{name}", torch.__version__)]
        for name in extension_names(flavour)
    }
    return (
        record is not None
        and record["torch"] == torch.__version__
        and record["edits"] == wanted
        and record.get("digest") == edits_digest()
    )


def compile_extension(flavour: str, name: str, destination: Path) -> list[str]:
    """Compile one extension in a scratch copy of its sources, with ort_zero's edits for the installed torch
    (`extension_sources`); its library lands in `destination`. Returns the names of the edits applied."""
    import torch

    env = dict(
        os.environ,
        ORTMODULE_TORCH_CPP_DIR=str(extensions_dir()),
        MAX_JOBS=os.environ.get("MAX_JOBS", str(os.cpu_count())),
        ONNXRUNTIME_ROCM_VERSION="",  # torch_gpu_allocator's setup.py reads it: empty means CUDA
    )
    with tempfile.TemporaryDirectory(prefix="ort_zero_ext_") as scratch:
        work = Path(scratch) / flavour / name
        shutil.copytree(extensions_dir() / flavour / name, work)
        edits = extension_sources.apply(Path(scratch), f"{flavour}/{name}", torch.__version__)
        if flavour == "cuda":
            env["CUDA_HOME"] = str(assemble_cuda_home(Path(scratch) / "cuda_home"))
        with_edits = f" with ort_zero's edits ({', '.join(edits)})" if edits else ""
        print(f"[extensions] building {flavour}/{name}{with_edits} (a few minutes on 2 cores)", flush=True)
        result = subprocess.run([sys.executable, "setup.py", "build"], cwd=work, env=env)
        built = list(work.glob("build/lib.*/*.so"))
        if result.returncode != 0 or not built:
            raise RuntimeError(
                f"building ORTModule's {flavour}/{name} extension failed (compiler output above). "
                "Check that g++ works and that a supported torch is installed (launch/bootstrap.sh)."
            )
        destination.mkdir(parents=True, exist_ok=True)
        for lib in built:
            place(lib, destination / lib.name)
    return edits


def place(source: Path, target: Path) -> None:
    """Copy by renaming into place: a process that has the old library loaded keeps its file intact."""
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copy2(source, staging)
    os.replace(staging, target)


def assemble_cuda_home(home: Path) -> Path:
    """A CUDA_HOME for g++ only: the CUDA headers torch's own dependencies carry and a `libcudart.so` to link.

    torch's build helper takes include/ and lib64/ from CUDA_HOME and calls nvcc only for .cu sources. torch's
    nvidia wheels bring most headers (CUDA 12: one folder per component; CUDA 13: all in nvidia/cu13); `crt/` (which
    cuda_runtime_api.h includes) only comes with triton's bundled copy of the same CUDA release, so triton's fills
    what the wheels lack."""
    import nvidia
    import triton

    nvidia_roots = [Path(folder) for folder in nvidia.__path__]
    wheel_includes = sorted(include for root in nvidia_roots for include in root.glob("*/include"))
    sources = [*wheel_includes, Path(triton.__file__).parent / "backends/nvidia/include"]
    include, lib64 = home / "include", home / "lib64"
    for source in sources:
        for header in sorted(p for p in source.rglob("*") if p.is_file() and "__" not in str(p.relative_to(source))):
            link = include / header.relative_to(source)
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(header)
    lib64.mkdir(parents=True)
    cudart = next(lib for root in nvidia_roots for lib in sorted(root.glob("*/lib/libcudart.so.*")))
    (lib64 / "libcudart.so").symlink_to(cudart)
    return home


def ensure() -> None:
    for flavour in wanted_flavours():
        if missing_extensions(flavour) or not up_to_date(flavour):
            build(flavour)
        print(f"[extensions] {flavour}: {', '.join(sorted(p.name for p in built_libraries(flavour)))}")
    print(f"[extensions] ort_zero: {trace_sources.ensure().stem}")  # the export's tracer callback


def smoke() -> None:
    """A tiny ORTModule forward/backward that must run in ORT: fallback disabled, ORT's session checked (with the
    torch.onnx patches ort_zero applies when ORT is first imported)."""
    os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
    import torch
    from onnxruntime.training.ortmodule import ORTModule

    model = ORTModule(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)))
    loss = model(torch.randn(3, 4)).square().sum()
    loss.backward()
    from ..foreign import onnxruntime as ort_internals

    if ort_internals.session(ort_internals.execution_manager(model, training=True)) is None:
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
