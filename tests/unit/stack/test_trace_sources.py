"""ort_zero's tracer callback (ort_zero/stack/trace_sources.py): built into ORT_ZERO_CACHE by the extensions step,
keyed on torch and the source's text, found again without a rebuild, and exporting the two C functions
`ort/export/source_ranges.py` calls. Compiles the callback once (about 15 s on 2 cores)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from ort_zero.stack import trace_sources


def test_it_is_built_into_the_cache_once_and_found_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORT_ZERO_CACHE", str(tmp_path))
    assert trace_sources.library() is None  # an empty cache: exports keep torch's callback
    built = trace_sources.ensure()
    assert built.is_relative_to(tmp_path) and trace_sources.library() == built
    stamp = built.stat().st_mtime_ns
    assert trace_sources.ensure() == built and built.stat().st_mtime_ns == stamp  # not rebuilt
    library = ctypes.CDLL(str(built))
    assert library.ort_zero_record_compared_sources and library.ort_zero_set_torch_recorder


def test_a_changed_source_is_another_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORT_ZERO_CACHE", str(tmp_path))
    before = trace_sources.build_directory()
    changed = tmp_path / "trace_sources.cpp"
    changed.write_text(trace_sources.SOURCE.read_text() + "// changed\n")
    monkeypatch.setattr(trace_sources, "SOURCE", changed)
    assert trace_sources.build_directory() != before
