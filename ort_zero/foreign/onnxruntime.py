"""ORTModule's internals that ort_zero reads and writes (onnxruntime-training `versions.ORT_VERSIONS`).

Read: an ORTModule's `_torch_module._execution_manager(is_training)`; a manager's `_onnx_models`, `_execution_agent`,
`_graph_transition_manager` (its `_exported_model_info`, `_post_export_processed_model_info`), `_runtime_options`,
`_device`, `_flattened_module` (its `_output_schema`), `_logger`, `time_tracker`; an agent's `_inference_session`;
the fallback manager's `_exception`; ORTModule's symbolics (`CustomOpSymbolicRegistry._SYMBOLICS`); the private
modules `capi._pybind_state`, `ortmodule._custom_op_symbolic_registry`, `ortmodule._custom_gradient_registry`,
`ortmodule._custom_autograd_function_exporter` (the Functions it exports its own way), `ortmodule._fallback` (its
export failure) and `ortmodule._logger`.
Written: the process's cached CPU execution provider (`forget_cpu_provider`), the memory optimizer's runtime options,
its memory observer's switch and probe (`memory_probe_unprofiled`), what a manager keeps once its session exists
(`release_kept`), the input bookkeeping of a post-export model info (`add_graph_input`), ORT's gradient registry
(`register_gradient`), and ort_zero's marks on ORT's objects.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx


def is_ort_module(model: Any) -> bool:
    return hasattr(model, "_torch_module")


def execution_manager(ort_module: Any, training: bool) -> Any:
    """The training (or inference) manager of an ORTModule."""
    return ort_module._torch_module._execution_manager(is_training=training)


def has_exported(ort_module: Any) -> bool:
    """Whether an ORTModule's training graph has been exported (the hooks a forward runs at export are then spent)."""
    return execution_manager(ort_module, True)._graph_transition_manager._exported_model_info is not None


def optimized_model(manager: Any) -> onnx.ModelProto | None:
    """The graph ORT's session runs (after ORT's and ort_zero's passes); None before the first build."""
    return manager._onnx_models.optimized_model


def session(manager: Any) -> Any:
    """A manager's ORT InferenceSession; None until ORT built it (then ORT did not run)."""
    agent = manager._execution_agent
    return None if agent is None else agent._inference_session


def agent_session(agent: Any) -> Any:
    """The InferenceSession of an execution agent (what `TrainingAgent.run_backward` runs)."""
    return agent._inference_session


def device(manager: Any) -> Any:
    return manager._device


def forget_cpu_provider() -> None:
    """onnxruntime-training keeps one CPU execution provider per process, made with the session options of the
    first session that asked for one, and gives it to every later session: their own `enable_cpu_mem_arena` is
    not read. Forgetting it makes the next session's provider from that session's options; sessions that have
    one keep it."""
    from onnxruntime.capi._pybind_state import clear_training_ep_instances

    clear_training_ep_instances()


def forward_function(manager: Any) -> Any:
    """The autograd Function a TrainingManager runs its session through (made once, when the manager is)."""
    return manager._forward_class


def flattened_module(manager: Any) -> Any:
    """The user's module as ORTModule exports it."""
    return manager._flattened_module


def manager_logger(manager: Any) -> Any:
    return manager._logger


def output_schema(flattened: Any) -> Any:
    """The structure of the outputs the flattened module's last forward returned (its trace's, at an export)."""
    return flattened._output_schema


def export_failure(error: Exception) -> Exception:
    """`error` as ORTModule's own export failure, on which its fallback policies act."""
    from onnxruntime.training.ortmodule._fallback import ORTModuleONNXModelException, wrap_exception

    return wrap_exception(ORTModuleONNXModelException, error)


def first_step_phases(ort_module: Any) -> dict[str, float]:
    """Seconds the training manager spent in each phase of its first step (ORT's own `TimeTracker`)."""
    from onnxruntime.training.ortmodule._logger import ORTModuleInitPhase, TimeTracker

    tracker = execution_manager(ort_module, training=True).time_tracker
    phases = {}
    for phase in ORTModuleInitPhase:
        start, end = tracker.starts_[phase], tracker.ends_[phase]
        if TimeTracker.NOT_RECORD not in (start, end):
            phases[phase.to_string()] = round(end - start, 3)
    return phases


def fallback_exception(fallback_manager: Any) -> BaseException | None:
    """The exception a fallback to PyTorch answers."""
    return fallback_manager._exception


def mark(ort_object: Any, name: str) -> bool:
    """Whether ort_zero marked an ORT object with `name` (e.g. a fallback it announced), marking it now."""
    attribute = f"_ort_zero_{name}"
    marked = getattr(ort_object, attribute, False)
    setattr(ort_object, attribute, True)
    return marked


def keep_for_fallback(manager: Any, name: str, value: Any) -> Any:
    """Keeps `value` on the fallback manager of `manager`'s ORTModule (one per model) under `name`; returns what
    was kept there before."""
    fallback_manager = manager._fallback_manager
    attribute = f"_ort_zero_{name}"
    previous = getattr(fallback_manager, attribute, None)
    setattr(fallback_manager, attribute, value)
    return previous


def kept_for_fallback(fallback_manager: Any, name: str) -> Any:
    """What `keep_for_fallback` kept on `fallback_manager` under `name`, or None."""
    return getattr(fallback_manager, f"_ort_zero_{name}", None)


def memory_optimizer_requested(manager: Any) -> tuple[int, str]:
    """ORT's memory optimizer settings for the session to be built: (level, plan config path)."""
    options = manager._runtime_options
    return options.memory_optimization_level, options.memory_optimizer_config_file_path


def turn_memory_optimizer_off(manager: Any) -> None:
    """ORT's memory optimizer off for the session to be built (no level, no plan, no probe)."""
    options = manager._runtime_options
    options.memory_optimization_level, options.memory_optimizer_config_file_path = 0, ""
    options.recompute_probe_config = "1:0"


def give_scalar_output_grads(manager: Any, indices: list[int]) -> None:
    """The model outputs at `indices` get a scalar zero from ORTModule's backward when PyTorch gives no gradient (the
    graph's YieldOp no longer asks for their full shape)."""
    if indices:
        info = manager._graph_info
        info.output_grad_indices_require_full_shape = [
            index for index in info.output_grad_indices_require_full_shape if index not in indices
        ]


@contextlib.contextmanager
def memory_probe_skipped(manager: Any) -> Iterator[None]:
    """While it lasts, building the session does not build a second one to probe ORT's memory optimizer (the
    memory observer's `_is_enabled` off; its per-step memory reports stay)."""
    observer = manager._runtime_inspector.memory_ob
    enabled, observer._is_enabled = observer._is_enabled, False
    try:
        yield
    finally:
        observer._is_enabled = enabled


@contextlib.contextmanager
def memory_probe_unprofiled(manager: Any) -> Iterator[None]:
    """While it lasts, the profile of the session ORT builds to probe its memory optimizer is ended and removed once
    probed: that session ran nothing, and its file stood beside the real session's."""
    observer = manager._runtime_inspector.memory_ob
    probe = observer.find_memory_optimization_opportunity

    @functools.wraps(probe)
    def unprofiled(agent: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return probe(agent, *args, **kwargs)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(agent._inference_session.end_profiling())

    observer.find_memory_optimization_opportunity = unprofiled
    try:
        yield
    finally:
        del observer.find_memory_optimization_opportunity


def release_kept(manager: Any, compacted: Callable[[onnx.ModelProto], onnx.ModelProto]) -> None:
    """Drops what a TrainingManager keeps beyond its needs once its session exists: its graph builder, the session's
    copy of the model bytes; the graphs it keeps are replaced by `compacted` copies."""
    manager._graph_builder = None
    models = manager._onnx_models
    if models.optimized_model is not None:
        models.optimized_model = compacted(models.optimized_model)
    transitions = manager._graph_transition_manager
    exported = transitions._exported_model_info
    if exported is not None and exported.exported_model is not None:
        exported.exported_model = compacted(exported.exported_model)
    processed = transitions._post_export_processed_model_info
    if processed is not None and processed._post_export_processed_model is not None:
        processed._post_export_processed_model = compacted(processed._post_export_processed_model)
    kept_session = getattr(manager._execution_agent, "_inference_session", None)
    if kept_session is not None:
        kept_session._model_bytes = None


def post_export_model(info: Any) -> onnx.ModelProto:
    """The graph of a PostExportProcessedModelInfo, as the export passes rewrite it in place."""
    return info._post_export_processed_model


def order_for_mem_efficient_grads(info: Any) -> None:
    """ORTModule then orders the graph to free memory early (its own trigger branch keys on another name)."""
    info.is_mem_efficient_grad_management_enabled = True


def add_graph_input(
    info: Any, name: str, removed: list[str], data: Callable[..., Any], ort_declares_grad_input: bool
) -> None:
    """Keeps ORTModule's input bookkeeping in step with a graph whose `removed` inputs are gone and which gained
    input `name` (requiring a gradient, its value from `data(args, kwargs)`). With ORTMODULE_ENABLE_ZERO_STAGE3=1
    ORT declares it a gradient input itself when it builds the gradient graph (`ort_declares_grad_input`)."""
    gone = set(removed)
    info.onnx_graph_input_names = [graph_input.name for graph_input in post_export_model(info).graph.input]
    info.onnx_graph_input_names_require_grad = [
        *(input_name for input_name in info.onnx_graph_input_names_require_grad if input_name not in gone),
        name,
    ]
    info.onnx_graph_input_names_user_defined = [*info.onnx_graph_input_names_user_defined, name]
    if not ort_declares_grad_input:
        info.onnx_graph_input_names_require_grad_user_defined = [
            *info.onnx_graph_input_names_require_grad_user_defined,
            name,
        ]
    info.onnx_graph_input_data_accessor_user_defined = {**info.onnx_graph_input_data_accessor_user_defined, name: data}


def ort_symbolic(op: str) -> Callable[..., Any] | None:
    """ORTModule's own export symbolic for `op` ("aten::layer_norm"), or None where it has none."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    namespace, _, name = op.partition("::")
    return CustomOpSymbolicRegistry._SYMBOLICS.get(("" if namespace == "aten" else namespace) + "::" + name)


def has_own_function_export(name: str) -> bool:
    """Whether ORT's exporter writes the Function `name` its own way (checkpoints, flash-attn, bitsandbytes)."""
    from onnxruntime.training.ortmodule._custom_autograd_function_exporter import _SpecialCustomFunctionHandler

    return _SpecialCustomFunctionHandler.get_handler(name) is not None


def register_autograd_function(name: str, cls: type) -> None:
    """Makes an autograd Function callable from PythonOps named `name`, as ORTModule registers those it exported."""
    from onnxruntime.capi._pybind_state import register_torch_autograd_function
    from onnxruntime.training.ortmodule._custom_autograd_function_exporter import (
        register_custom_function_schema_supplementary,
    )

    _empty_registry_at_exit()
    register_torch_autograd_function(name, cls)
    register_custom_function_schema_supplementary(cls)


@functools.cache
def _empty_registry_at_exit() -> None:
    """ORT's Function registry must be emptied before the interpreter ends (or the process crashes at exit);
    ORTModule arranges that only when it enables custom Functions itself, so it is arranged here too, once."""
    import atexit

    from onnxruntime.capi._pybind_state import unregister_python_functions

    atexit.register(unregister_python_functions)


def register_gradient(domain: str, op_type: str, nodes: list[tuple]) -> None:
    """Registers `nodes` (ORTModule's custom-gradient notation: (op, inputs, outputs[, attributes]) with GO(i), I(i),
    GI(i)) as ORT's gradient of every node `domain::op_type`, as ORTModule registers its own at construction."""
    from onnxruntime.capi._pybind_state import register_gradient_definition
    from onnxruntime.training.ortmodule._custom_gradient_registry import _to_gradient_definition

    register_gradient_definition(f"{domain}::{op_type}", _to_gradient_definition(nodes))
