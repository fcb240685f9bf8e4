"""Whether an ORT session keeps its CPU arena (`ort_zero.memory.arena`): off on the CPU where the graph recomputes its
layers or the model is 16-bit, on elsewhere, ORT_ZERO_CPU_MEM_ARENA deciding for every session when set. (A session
given the arena it was told: tests/unit/ort/ortmodule/test_graph_execution_manager.py.)"""

from __future__ import annotations

import pytest

from ort_zero.memory.arena import cpu_arena_kept


@pytest.mark.parametrize(
    ("on_cpu", "recomputes", "sixteen_bit", "kept", "because"),
    [
        (True, False, False, True, ""),
        (True, True, False, False, "the graph recomputes layers"),
        (True, False, True, False, "the model is 16-bit"),
        (False, True, True, True, ""),  # CUDA's arena is ORT's to keep
    ],
)
def test_unset_the_graph_decides(
    monkeypatch: pytest.MonkeyPatch, on_cpu: bool, recomputes: bool, sixteen_bit: bool, kept: bool, because: str
) -> None:
    monkeypatch.delenv("ORT_ZERO_CPU_MEM_ARENA", raising=False)
    assert cpu_arena_kept(on_cpu, recomputes, sixteen_bit) == (kept, because)


@pytest.mark.parametrize(("chosen", "kept"), [("0", False), ("1", True)])
def test_the_setting_decides_for_every_session(monkeypatch: pytest.MonkeyPatch, chosen: str, kept: bool) -> None:
    monkeypatch.setenv("ORT_ZERO_CPU_MEM_ARENA", chosen)
    for graph in [(True, True, True), (True, False, False), (False, False, False)]:
        assert cpu_arena_kept(*graph) == (kept, "")
