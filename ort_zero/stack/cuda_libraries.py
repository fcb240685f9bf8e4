"""The CUDA 11 libraries ORT's CUDA provider needs, installed beside the venv and found without LD_LIBRARY_PATH.

onnxruntime-training 1.19.2 is a CUDA 11.8 build; PyPI's torch 2.6.0 is CUDA 12.4, so torch's wheels do not carry
what `libonnxruntime_providers_cuda.so` NEEDs. PyPI has them as nvidia-*-cu11 wheels; they go into their own
directory (`<venv>/ort_zero-cuda11/site`), because in torch's site-packages they would collide with torch's
`nvidia/curand` and headers. The provider's RUNPATH is only /usr/local/cuda-11.8/lib, so `preload` dlopens them by
path before ORT loads the provider; the loader then matches the provider's NEEDED entries by SONAME. Their symbols
carry version tags, so they live beside torch's CUDA 12 libraries in one process.

    python -m ort_zero.stack.cuda_libraries install   # download (cached in the venv) and install; idempotent
    python -m ort_zero.stack.cuda_libraries check     # every library the provider NEEDs, and where it resolves

Imports only the standard library: `make_findable` runs before ORT is first imported (`ort_zero.ort_import`).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from .elf import read_dynamic, system_library

WHEELS = (
    "nvidia-cuda-runtime-cu11==11.8.89",
    "nvidia-cublas-cu11==11.11.3.6",
    "nvidia-cufft-cu11==10.9.0.58",
    "nvidia-curand-cu11==10.3.0.86",
    "nvidia-cudnn-cu11==8.9.6.50",  # the last cuDNN 8, the major version ORT 1.19.2 links
    "nvidia-cuda-nvrtc-cu11==11.8.89",  # cuDNN 8's sub-libraries open libnvrtc at run time
)
# Loaded by path, dependencies first. Not found through any RUNPATH: the provider's NEEDED entries, and the nvrtc
# that cuDNN looks for in ../../nvrtc/lib while the wheel puts it in cuda_nvrtc/lib.
PRELOAD = (
    "libcudart.so.11.0",
    "libcublasLt.so.11",
    "libcublas.so.11",
    "libcufft.so.10",
    "libcurand.so.10",
    "libnvrtc.so.11.2",
    "libcudnn.so.8",
)
# Opened with dlopen by name at run time (not in DT_NEEDED): each must resolve too.
OPENED_AT_RUN_TIME = {
    "libcudnn.so.8": ("libcudnn_ops_infer.so.8", "libcudnn_cnn_infer.so.8", "libcudnn_adv_infer.so.8"),
    "libcudnn_ops_infer.so.8": ("libnvrtc.so.11.2",),
}
PROVIDER = "libonnxruntime_providers_cuda.so"
INSTALL_COMMAND = "ORT_ZERO_CUDA=1 launch/bootstrap.sh"
_loaded: dict[str, ctypes.CDLL] = {}  # a library loaded stays loaded as long as the process


def home() -> Path:
    """Where the CUDA 11 libraries and their downloaded wheels live (inside the venv unless ORT_ZERO_CUDA_HOME)."""
    return Path(os.environ.get("ORT_ZERO_CUDA_HOME") or Path(sys.prefix) / "ort_zero-cuda11")


def wanted() -> bool:
    """A machine that trains on NVIDIA GPUs (a driver is installed), or asked for explicitly with ORT_ZERO_CUDA=1."""
    return os.environ.get("ORT_ZERO_CUDA") == "1" or driver_present()


def driver_present() -> bool:
    """The NVIDIA driver's user-space library, which the CUDA runtime opens on first use (no GPU call is made)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def install(target: Path | None = None, wheels: Path | None = None) -> Path:
    """pip-install WHEELS into `target` (default `home()/site`); downloads go to `wheels` (default `home()/wheels`)
    once, so a reinstall, or a test's install into a scratch directory, needs no network."""
    target = target or home() / "site"
    wheels = wheels or home() / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    if len(list(wheels.glob("nvidia_*.whl"))) < len(WHEELS):
        wheels.mkdir(parents=True, exist_ok=True)
        print(f"[cuda] downloading {len(WHEELS)} nvidia-*-cu11 wheels (1.4 GB) into {wheels}", flush=True)
        _pip(pip + ["download", "--no-deps", "--only-binary=:all:", "--dest", str(wheels), *WHEELS])
    print(f"[cuda] installing the CUDA 11 libraries into {target}", flush=True)
    _pip(pip + ["install", "--no-deps", "--no-index", "--find-links", str(wheels), "--upgrade", "--target",
                str(target), *WHEELS])  # fmt: skip
    missing = sorted(set(PRELOAD) - set(libraries(target)))
    if missing:
        raise RuntimeError(f"installed into {target} but {', '.join(missing)} is not there")
    return target


def _pip(command: list[str]) -> None:
    if subprocess.run(command).returncode != 0:
        raise RuntimeError(f"'{' '.join(command[2:5])} ...' failed (pip output above): check access to PyPI")


def libraries(target: Path) -> dict[str, Path]:
    """file name -> path of every shared library the wheels put under `target` (nvidia/<component>/lib/)."""
    return {path.name: path for path in sorted(target.glob("nvidia/*/lib/*.so*"))}


def provider_library() -> Path:
    """ORT's CUDA provider, found without importing onnxruntime."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        raise RuntimeError("onnxruntime-training is not installed")
    return Path(spec.origin).parent / "capi" / PROVIDER


def torch_curand() -> Path | None:
    """torch's own libcurand.so.10 (CUDA 12 or 13, same SONAME; it serves ORT too): preloading the CUDA 11 one
    instead would hand it to torch as well, whose libraries then find a libcurand.so.10 already loaded."""
    spec = importlib.util.find_spec("nvidia")
    for folder in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        for layout in ("curand", "cu13"):  # CUDA 12 wheels: one folder per component; CUDA 13: one for all
            candidate = Path(folder) / layout / "lib" / "libcurand.so.10"
            if candidate.exists():
                return candidate
    return None


def preload_paths(target: Path) -> list[Path]:
    """What `preload` opens, in order."""
    found = libraries(target)
    curand = torch_curand()
    return [curand if name == "libcurand.so.10" and curand else found[name] for name in PRELOAD if name in found]


def preload(target: Path | None = None) -> list[Path]:
    """dlopen the PRELOAD libraries by path, so that ORT's provider finds them by SONAME when it loads."""
    paths = preload_paths(target or home() / "site")
    for path in paths:
        if path.name not in _loaded:
            _loaded[path.name] = ctypes.CDLL(str(path))
    return paths


def preloaded() -> list[str]:
    """The libraries `preload` opened in this process."""
    return sorted(_loaded)


def make_findable() -> None:
    """Before ORT is first imported: on a machine with an NVIDIA driver and the libraries installed, preload them.

    Nothing happens elsewhere: without a driver ORT's provider could not start anyway. A larger CUDA JIT cache
    (unless set): ORT 1.19.2 has no sm_90 kernels, and H100s compile its PTX on first use (default cache 256 MiB)."""
    if _loaded or not (home() / "site").is_dir() or not driver_present():
        return
    os.environ.setdefault("CUDA_CACHE_MAXSIZE", str(4 * 2**30))
    preload()


def resolve(target: Path | None = None) -> dict[str, dict[str, Path | None]]:
    """For ORT's provider and, in turn, every CUDA 11 library it reaches: each library it needs (NEEDED, or opened
    by name at run time) -> where the loader finds it once `preload` ran, or None. Reads ELF headers only."""
    target = target or home() / "site"
    preloaded = {path.name: path for path in preload_paths(target)}
    report: dict[str, dict[str, Path | None]] = {}
    pending = [provider_library()]
    while pending:
        library = pending.pop(0)
        if library.name in report:
            continue
        info = read_dynamic(library)
        entries: dict[str, Path | None] = {}
        for needed in (*info.needed, *OPENED_AT_RUN_TIME.get(library.name, ())):
            found = preloaded.get(needed) or _in_dirs(needed, info.search_path)
            entries[needed] = found or system_library(needed)
            if found and found.is_relative_to(target):
                pending.append(found)
        report[library.name] = entries
    return report


def _in_dirs(soname: str, directories: tuple[str, ...]) -> Path | None:
    return next((Path(d) / soname for d in directories if (Path(d) / soname).exists()), None)


def unresolved(report: dict[str, dict[str, Path | None]]) -> list[str]:
    return [f"{needed} (needed by {library})" for library, entries in report.items() for needed, path in
            entries.items() if path is None]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["install", "check"])
    parser.add_argument("--target", type=Path, help="install/check here instead of the venv's ort_zero-cuda11/site")
    args = parser.parse_args(argv)
    try:
        if args.action == "install":
            install(args.target)
        report = resolve(args.target)
    except Exception as error:  # the bootstrap shows this line, not a traceback
        print(f"[cuda] ERROR: {error}", file=sys.stderr)
        return 1
    missing = unresolved(report)
    if missing:
        print(f"[cuda] ERROR: not found: {', '.join(missing)}. Run '{INSTALL_COMMAND}'.", file=sys.stderr)
        return 1
    print(f"[cuda] every library ORT's CUDA provider needs resolves ({len(report)} libraries checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
