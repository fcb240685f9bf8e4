"""Which training graphs get ORT's memory reuse back (`ort_zero.ort.memory_reuse`), on hand-built graphs.

That reuse is safe for ort_zero's own PythonOps, and that it changes no number, is shown on 2 ranks in
`tests/distributed/test_recompute.py` (reuse on and off train identically, gradients included).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import onnx
import pytest
from onnx import helper

pytest.importorskip("onnxruntime.training.ortmodule")

import onnxruntime  # noqa: E402

from ort_zero import settings  # noqa: E402
from ort_zero.ort import memory_reuse  # noqa: E402
from ort_zero.ort.graph import MS_DOMAIN, qualified_name  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge, PreForwardBridge  # noqa: E402


def python_op(func: str, name: str) -> onnx.NodeProto:
    return helper.make_node("PythonOp", [f"{name}_in"], [f"{name}_ctx", f"{name}_out"], name, domain=MS_DOMAIN,
                            func_name=func)  # fmt: skip


def graph(*funcs: str) -> onnx.GraphProto:
    return helper.make_graph([python_op(func, f"op{i}") for i, func in enumerate(funcs)], "g", [], [])


ZERO3 = (qualified_name(PreForwardBridge), qualified_name(PostForwardBridge))


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ORT_ZERO_MEMORY_REUSE", "1")
    monkeypatch.setattr(settings, "ort_memory_reuse", False)
    monkeypatch.setattr(memory_reuse, "_announced", set())
    yield


def test_a_zero3_graph_of_ort_zeros_functions_gets_reuse() -> None:
    options = onnxruntime.SessionOptions()
    options.enable_mem_reuse = False  # what ORTModule sets

    assert memory_reuse.enable(options, graph(*ZERO3))
    assert options.enable_mem_reuse and settings.ort_memory_reuse


def test_a_foreign_function_keeps_reuse_off_and_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    model = graph(*ZERO3, "user_code.MyFunction")
    options = onnxruntime.SessionOptions()
    options.enable_mem_reuse = False

    with caplog.at_level(logging.WARNING, logger=memory_reuse.__name__):
        assert not memory_reuse.allowed(model)
        assert not memory_reuse.enable(options, model)

    assert not options.enable_mem_reuse and not settings.ort_memory_reuse
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "user_code.MyFunction" in warnings[0] and "stays off" in warnings[0]


def test_graphs_without_zero3_and_the_switch_keep_ortmodules_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not memory_reuse.allowed(graph(qualified_name(PostForwardBridge)))  # no gathering: not ZeRO-3
    assert not memory_reuse.allowed(graph())
    monkeypatch.setenv("ORT_ZERO_MEMORY_REUSE", "0")
    assert not memory_reuse.allowed(graph(*ZERO3))
    monkeypatch.delenv("ORT_ZERO_MEMORY_REUSE")  # opt-in
    assert not memory_reuse.allowed(graph(*ZERO3))
