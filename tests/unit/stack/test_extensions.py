"""ORTModule's GPU allocator extension builds with g++ alone (any nvcc call fails the build) and imports under torch;
`fused_ops`, which needs nvcc, is never among the extensions built. No GPU needed; the build takes about 1.5 minutes
on 2 cores and bypasses the build cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ort_zero.stack import extensions

IMPORT_ALLOCATOR = """
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location("torch_gpu_allocator", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(module.gpu_caching_allocator_raw_alloc_address() != module.gpu_caching_allocator_raw_delete_address() != 0)
"""


def test_fused_ops_is_never_built() -> None:
    assert (extensions.extensions_dir() / "cuda" / "fused_ops" / "setup.py").exists()  # ORT ships it
    assert extensions.extension_names("cuda") == ["torch_gpu_allocator"]


@pytest.mark.extended  # a GPU host's build, checked on CPU: 35 s
def test_gpu_allocator_builds_without_nvcc_and_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    called = tmp_path / "nvcc-was-called"
    (tools / "nvcc").write_text(f"#!/bin/sh\ntouch {called}\nexit 1\n")
    (tools / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    edits = extensions.compile_extension("cuda", "torch_gpu_allocator", tmp_path / "built")
    assert not called.exists()
    assert edits == ["emptyCache takes a pool"]
    (library,) = (tmp_path / "built").glob("torch_gpu_allocator*.so")
    child = subprocess.run([sys.executable, "-c", IMPORT_ALLOCATOR, str(library)], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip().splitlines()[-1] == "True"
