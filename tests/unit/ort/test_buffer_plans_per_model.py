"""ORT's buffer plans stay with the model whose graph they were made for: a model that falls back to PyTorch forgets
its own, another model keeps its, and a model's new graph replaces its old graph's plans."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import onnx
from onnx import helper

import ort_zero  # noqa: F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.foreign import onnxruntime as ort_internals  # noqa: E402
from ort_zero.ort.ortmodule import graph_execution_manager, training_manager  # noqa: E402
from ort_zero.python_op import MS_DOMAIN, function_name  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge  # noqa: E402

POST = function_name(PostForwardBridge)


class Registry:
    """Where ORT's graph optimizers run (none here): ort_zero's training-graph passes follow them."""

    @classmethod
    def optimize_all(cls, module_name: str, device: str, graph: onnx.GraphProto) -> None:
        pass


def training_graph(key: int) -> onnx.GraphProto:
    """One pass-through PythonOp (module key `key`) and its gradient node."""
    forward = helper.make_node("PythonOp", ["x"], ["ctx", "y"], "post", domain=MS_DOMAIN, func_name=POST,
                               input_int_scalars=[key], tensor_reuse_map=[-1, 0])  # fmt: skip
    backward = helper.make_node("PythonOpGrad", ["ctx", "d_y"], ["d_x"], "post_grad", domain=MS_DOMAIN, func_name=POST)
    return helper.make_graph([forward, backward], "g", [], [])


def a_manager() -> Any:
    """A TrainingManager as ort_zero sees it: its ORTModule's fallback manager and the exception it answers."""
    return SimpleNamespace(
        _fallback_manager=SimpleNamespace(_exception=RuntimeError("an op ORT cannot run")),
        _onnx_models=SimpleNamespace(optimized_model=None),  # ORT sets it before its registry runs; none here
    )


optimize_all = training_manager.graph_optimizers(Registry.__dict__["optimize_all"]).__get__(None, Registry)
build_graph = training_manager.graph_built_by(lambda manager, key: optimize_all("Model", "cpu", training_graph(key)))
fall_back = graph_execution_manager.loud_fallback(
    lambda fallback_manager, log_level, *inputs, **kwargs: "ran in PyTorch"
)


def plans_of(manager: Any) -> Any:
    return ort_internals.kept_for_fallback(manager._fallback_manager, "buffer_plans")


def test_a_model_that_falls_back_forgets_only_its_own_plans() -> None:
    falling, staying = a_manager(), a_manager()
    build_graph(falling, 9101)
    build_graph(staying, 9102)
    assert plans_of(falling).planned(POST, (9101,)) is not None

    assert fall_back(falling._fallback_manager, 0) == "ran in PyTorch"

    assert plans_of(falling).planned(POST, (9101,)) is None
    assert plans_of(staying).planned(POST, (9102,)) is not None
    plans_of(staying).forget()


def test_a_new_graph_replaces_the_plans_of_the_models_old_one() -> None:
    manager = a_manager()
    build_graph(manager, 9103)
    old = plans_of(manager)
    build_graph(manager, 9104)

    assert old.planned(POST, (9103,)) is None
    assert plans_of(manager).planned(POST, (9104,)) is not None
    plans_of(manager).forget()
