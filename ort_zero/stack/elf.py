"""What a shared library asks the dynamic loader for, read from its ELF dynamic section, and where the loader finds it.

Used to check, without a GPU and without loading anything, that every library ORT's CUDA provider NEEDs is on this
machine. Only 64-bit little-endian ELF (x86-64, aarch64), the platforms onnxruntime-training has Linux wheels for.
"""

from __future__ import annotations

import functools
import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 14, 15, 29
# Where glibc looks after RUNPATH and LD_LIBRARY_PATH when ld.so.cache does not list a library.
DEFAULT_DIRS = ("/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib")


@dataclass(frozen=True)
class DynamicInfo:
    soname: str | None
    needed: tuple[str, ...]
    search_path: tuple[str, ...]  # RUNPATH (or the older RPATH), $ORIGIN expanded


def read_dynamic(path: Path) -> DynamicInfo:
    """DT_SONAME, DT_NEEDED and DT_RUNPATH/DT_RPATH of `path`; reads only headers and the dynamic section."""
    with open(path, "rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
        (phoff,) = struct.unpack_from("<Q", header, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        file.seek(phoff)
        table = file.read(phentsize * phnum)
        segments = [struct.unpack_from("<IIQQQQQQ", table, i * phentsize) for i in range(phnum)]
        dynamic = next((s for s in segments if s[0] == _PT_DYNAMIC), None)
        if dynamic is None:
            raise ValueError(f"{path} has no dynamic section (a static executable?)")
        file.seek(dynamic[2])
        raw = file.read(dynamic[5])
        entries = [struct.unpack_from("<qQ", raw, i) for i in range(0, len(raw) - 15, 16)]
        entries = entries[: next((i for i, (tag, _) in enumerate(entries) if tag == _DT_NULL), len(entries))]
        strtab_address = next(value for tag, value in entries if tag == _DT_STRTAB)
        # DT_STRTAB is a virtual address: find the loadable segment holding it to get its place in the file.
        load = next(s for s in segments if s[0] == _PT_LOAD and s[3] <= strtab_address < s[3] + s[5])
        strtab_offset = strtab_address - load[3] + load[2]

        def string(offset: int) -> str:
            file.seek(strtab_offset + offset)
            return file.read(4096).split(b"\0", 1)[0].decode()

        wanted = (_DT_SONAME, _DT_RPATH, _DT_RUNPATH)
        values = {tag: [string(value) for t, value in entries if t == tag] for tag in wanted}
        needed = tuple(string(value) for tag, value in entries if tag == _DT_NEEDED)
    path_list = values[_DT_RUNPATH] or values[_DT_RPATH]
    origin = str(Path(path).resolve().parent)
    search_path = tuple(
        entry.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
        for joined in path_list
        for entry in joined.split(":")
        if entry
    )
    return DynamicInfo(next(iter(values[_DT_SONAME]), None), needed, search_path)


@functools.cache
def _ld_cache() -> dict[str, str]:
    """soname -> path from `ldconfig -p` (64-bit entries); empty when ldconfig is not there."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
        except OSError:
            continue
        found: dict[str, str] = {}
        for line in listing.splitlines()[1:]:
            name, _, target = line.strip().partition(" => ")
            if "64" in name.partition("(")[2]:  # (libc6,x86-64) or (libc6,AArch64), not 32-bit (libc6)
                found.setdefault(name.split(" (")[0], target)
        return found
    return {}


def system_library(soname: str) -> Path | None:
    """Where the loader finds `soname` on this machine without any RUNPATH: LD_LIBRARY_PATH, ld.so.cache, defaults."""
    extra = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for directory in extra:
        if (Path(directory) / soname).exists():
            return Path(directory) / soname
    if soname in _ld_cache():
        return Path(_ld_cache()[soname])
    return next((Path(d) / soname for d in DEFAULT_DIRS if (Path(d) / soname).exists()), None)
