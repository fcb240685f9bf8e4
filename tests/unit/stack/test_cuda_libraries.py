"""The CUDA 11 libraries for ORT's CUDA provider: installed into a scratch target, every library the provider needs
resolves there (ELF check), and the dynamic loader itself agrees once they are preloaded. No GPU needed.

Cost: the nvidia-*-cu11 wheels (1.4 GB) are downloaded once per venv into `<venv>/ort_zero-cuda11/wheels` (the same
cache `ORT_ZERO_CUDA=1 launch/bootstrap.sh` fills; measured 18 s here), then each run installs them from there into a
scratch directory without network (2.1 GB, measured 18 s) and deletes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ort_zero.stack import cuda_libraries
from ort_zero.stack.elf import read_dynamic

# In a child: preload from the target, then dlopen each name the way the loader looks up a NEEDED entry (by SONAME,
# no path) and ask the loader which file it mapped (dlinfo RTLD_DI_LINKMAP -> link_map.l_name).
LOADER_CHECK = """
import ctypes, json, sys
from pathlib import Path
from ort_zero.stack import cuda_libraries
cuda_libraries.preload(Path(sys.argv[1]))
libc = ctypes.CDLL(None)
dlinfo = getattr(libc, "dlinfo", None) or ctypes.CDLL("libdl.so.2").dlinfo
class LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]
found = {}
for name in sys.argv[2:]:
    handle = ctypes.CDLL(name)
    link = ctypes.POINTER(LinkMap)()
    assert dlinfo(ctypes.c_void_p(handle._handle), 2, ctypes.byref(link)) == 0
    found[name] = link.contents.l_name.decode()
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def scratch_target() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ort_zero_cuda11_") as scratch:
        yield cuda_libraries.install(Path(scratch) / "site")


@pytest.mark.extended  # installs 2.1 GB of CUDA wheels into a scratch target
def test_install_resolves_every_library_the_provider_needs(scratch_target: Path) -> None:
    report = cuda_libraries.resolve(scratch_target)
    assert cuda_libraries.unresolved(report) == []
    provider_needs = report[cuda_libraries.PROVIDER]
    assert set(provider_needs) == set(read_dynamic(cuda_libraries.provider_library()).needed)
    for name in ("libcudart.so.11.0", "libcublas.so.11", "libcublasLt.so.11", "libcufft.so.10", "libcudnn.so.8"):
        assert provider_needs[name].is_relative_to(scratch_target), (name, provider_needs[name])
    # cuDNN's run-time pieces were followed too: its sub-libraries and the nvrtc they open
    assert report["libcudnn_ops_infer.so.8"]["libnvrtc.so.11.2"].is_relative_to(scratch_target)


def test_nothing_installed_is_reported_missing(tmp_path: Path) -> None:
    missing = cuda_libraries.unresolved(cuda_libraries.resolve(tmp_path))
    assert "libcublasLt.so.11 (needed by libonnxruntime_providers_cuda.so)" in missing
    assert "libcudnn.so.8 (needed by libonnxruntime_providers_cuda.so)" in missing


@pytest.mark.extended  # installs 2.1 GB of CUDA wheels into a scratch target
def test_the_loader_maps_each_preloaded_soname_to_the_target(scratch_target: Path) -> None:
    cuda_names = [n for n in read_dynamic(cuda_libraries.provider_library()).needed if n in cuda_libraries.PRELOAD]
    child = subprocess.run(
        [sys.executable, "-c", LOADER_CHECK, str(scratch_target), *cuda_names, "libnvrtc.so.11.2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    mapped = json.loads(child.stdout.splitlines()[-1])
    expected = {path.name: str(path) for path in cuda_libraries.preload_paths(scratch_target)}
    assert mapped == {name: expected[name] for name in [*cuda_names, "libnvrtc.so.11.2"]}


@pytest.mark.extended  # installs 2.1 GB of CUDA wheels into a scratch target
def test_ort_import_preloads_only_where_a_driver_is(scratch_target: Path) -> None:
    """Importing ORT after ort_zero preloads the libraries where a driver is, and nowhere else."""
    code = "import ort_zero, onnxruntime; from ort_zero.stack import cuda_libraries as c; "
    code += "print(c.driver_present(), c.preloaded())"
    env = dict(os.environ, ORT_ZERO_CUDA_HOME=str(scratch_target.parent))
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert child.returncode == 0, child.stderr
    driver, preloaded = child.stdout.strip().split(" ", 1)
    assert preloaded == (str(sorted(path.name for path in cuda_libraries.preload_paths(scratch_target))) if driver ==
                         "True" else "[]")  # fmt: skip
