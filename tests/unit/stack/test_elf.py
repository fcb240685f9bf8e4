"""ort_zero.stack.elf: the dynamic section as the loader reads it, checked against binutils' readelf."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ort_zero.stack.cuda_libraries import provider_library
from ort_zero.stack.elf import read_dynamic, system_library


def readelf_dynamic(path: Path) -> tuple[str | None, list[str], list[str]]:
    listing = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    values = {kind: re.findall(rf"\({kind}\)\s+.*?\[(.*)\]", listing) for kind in ("SONAME", "NEEDED", "RUNPATH")}
    return next(iter(values["SONAME"]), None), values["NEEDED"], values["RUNPATH"]


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils' readelf is the reference")
def test_same_as_readelf_for_ort_torch_and_python_libraries() -> None:
    import torch

    libraries = [provider_library(), *sorted(Path(torch.__file__).parent.glob("lib/*.so*"))[:6]]
    libraries.append(Path(sys.executable).resolve())
    for library in libraries:
        info = read_dynamic(library)
        soname, needed, runpath = readelf_dynamic(library)
        assert (info.soname, list(info.needed)) == (soname, needed), library
        origin = str(library.resolve().parent)
        expected = [e.replace("$ORIGIN", origin) for joined in runpath for e in joined.split(":") if e]
        assert list(info.search_path) == expected or not runpath, library


def test_ort_provider_is_a_cuda_11_build() -> None:
    """The facts the CUDA side is built on, read off the installed wheel."""
    info = read_dynamic(provider_library())
    assert {"libcudart.so.11.0", "libcublas.so.11", "libcublasLt.so.11", "libcudnn.so.8"} <= set(info.needed)
    assert info.search_path == ("/usr/local/cuda-11.8/lib",)


def test_not_elf_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "libnot.so"
    text.write_text("not a library")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        read_dynamic(text)


def test_system_library_finds_libc_and_not_a_made_up_one() -> None:
    assert system_library("libc.so.6") is not None and system_library("libc.so.6").exists()
    assert system_library("libort_zero_no_such_library.so.1") is None
