"""ORTModule integration: the replacements that `ort_zero.patches` installs into onnxruntime-training 1.19.2.

Each function here takes the original ORT object and returns its replacement (the registry's factory protocol).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ... import settings
from ...foreign import ortmodule
from ...foreign import torch as torch_internals
from ...zero3 import external_params
from ..export.context import is_zero3_module, stood_in_for_export
from ..export.errors import naming_export_failures
from ..graph.edit import is_zero3_graph
from ..passes.base import ExportedGraph, TrainingGraph
from ..passes.pipeline import run_export_passes, run_training_graph_passes
from ..passes.zero3_params import TRIGGER_NAME
from .footprint import trim_training_manager

logger = logging.getLogger(__name__)


def export_context(
    original: Callable, during_export: Callable[[torch.nn.Module], contextlib.AbstractContextManager]
) -> Callable:
    """Replaces `stage3_export_context`: ORT's needs `torch.onnx._internal._beartype`, gone in torch >= 2.5.

    Every export (ZeRO-3 or not) runs inside it, so export failures name their module. A ZeRO-3 export also runs
    inside `during_export(module)` (the registry's export-time patches: torch's own F.linear, and rewrites of the
    model code the module runs)."""

    @contextlib.contextmanager
    def zero3_export_context(enable: bool, stage3_param_handle: Any, flattened_module: torch.nn.Module) -> Iterator:
        with contextlib.ExitStack() as stack:
            stack.enter_context(naming_export_failures(flattened_module))
            if is_zero3_module(flattened_module):
                stack.enter_context(during_export(flattened_module))
                stack.enter_context(stood_in_for_export(flattened_module))
            yield

    return zero3_export_context


def schema_forward(
    original: Callable, during_export: Callable[[torch.nn.Module], contextlib.AbstractContextManager]
) -> Callable:
    """Wraps ORTModule's output-schema forward: it runs before the export context and must not gather either.

    It only reads the structure of the outputs and how many dimensions each has, so it runs on fake tensors: no
    compute and no activations (a real forward holds the whole model's, logits included, before the trace runs it
    again), and, where the model needs real values (a data-dependent branch, an op fake tensors lack), on real ones."""

    @functools.wraps(original)
    def parse_outputs(flattened_module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not is_zero3_module(flattened_module):
            return original(flattened_module, *args, **kwargs)
        with during_export(flattened_module), stood_in_for_export(flattened_module), external_params.discovering():
            try:
                with torch_internals.fake_tensors(), warnings.catch_warnings():
                    # ORTModule deep-copies the inputs, and torch's deepcopy asks a fake copy for its data pointer
                    warnings.filterwarnings("ignore", "Accessing the data pointer of FakeTensor", UserWarning)
                    return original(flattened_module, *args, **kwargs)
            except Exception as error:  # noqa: BLE001  (any failure on fake tensors: the real forward decides)
                logger.debug("ort_zero: the output-schema forward needs real tensors (%s)", error)
            return original(flattened_module, *args, **kwargs)

    return parse_outputs


# The TrainingManager whose `_build_graph` is running (set by `graph_built_by`), for the training-graph passes.
_BUILDING: contextvars.ContextVar[Any] = contextvars.ContextVar("ort_zero_building_manager", default=None)


def graph_optimizers(original: Any) -> Any:
    """Wraps ORT's graph-optimizer registry run on the training graph: ORT's optimizers, then ort_zero's
    training-graph passes (`passes.pipeline`; a graph without ort_zero's PythonOps is left alone)."""

    def optimize_all(cls: type, module_name: str, device: str, graph: Any) -> None:
        original.__get__(None, cls)(module_name, device, graph)
        training = TrainingGraph(graph, settings.recompute_level())
        run_training_graph_passes(training)
        if (manager := _BUILDING.get()) is not None:
            # this model's earlier graph is gone: its plans go (the new graph's plans for the same PythonOps stay)
            previous = ortmodule.keep_for_fallback(manager, "buffer_plans", training.buffer_plans)
            if previous is not None:
                previous.forget()

    return classmethod(optimize_all)


def graph_built_by(original: Callable) -> Callable:
    """Wraps `TrainingManager._build_graph`: ORT's optimizer registry learns only the model's class name, so the
    manager building the graph is noted while it does, and the training-graph passes' results stay with its model."""

    @functools.wraps(original)
    def build_graph(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _BUILDING.set(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            _BUILDING.reset(token)

    return build_graph


def zero3_memory_optimizer_off(original: Callable) -> Callable:
    """Wraps `TrainingManager._create_execution_agent`: for a ZeRO-3 graph, ORT's own memory optimizer stays off.

    It cannot recompute through the bridges and what it recomputes reads forward-gathered parameters; ort_zero's
    recompute pass has already applied the level (`ort_zero.ort.passes.recompute`). So ORT's probe of it, a second
    session built at the first step only to list what it could recompute, is not built either (it also fails on
    graphs whose symbolic dims sympy cannot parse)."""

    @functools.wraps(original)
    def _create_execution_agent(self: Any) -> None:
        level, plans = ortmodule.memory_optimizer_requested(self)
        model = ortmodule.optimized_model(self)
        if model is None or not is_zero3_graph(model.graph):
            original(self)
            return
        if level or plans:
            if level == 0:
                logger.warning(
                    "ort_zero: ORTMODULE_MEMORY_OPT_CONFIG plans are not applied to a ZeRO-3 model (they would read "
                    "parameters gathered in the forward); use ORTMODULE_MEMORY_OPT_LEVEL=1 for ort_zero's "
                    "layer-wise recompute"
                )
            ortmodule.turn_memory_optimizer_off(self)
        with ortmodule.memory_probe_skipped(self):
            original(self)

    return _create_execution_agent


def footprint_trimmed(original: Callable) -> Callable:
    """Wraps `TrainingManager._create_execution_agent`: once the session exists, what ORTModule keeps beyond its
    needs goes (`ort_zero.ort.ortmodule.footprint`: its graph builder, its graphs' dead protobuf memory, the export's
    heap)."""

    @functools.wraps(original)
    def _create_execution_agent(self: Any) -> None:
        original(self)
        trim_training_manager(self)

    return _create_execution_agent


def deep_clone_check(original: Callable) -> Callable:
    """Copies of ZeRO-3 parameters lose their `ds_*` attributes: never deep-copy a ZeRO-3 module before export."""

    @functools.wraps(original)
    def can_module_be_deep_cloned(module: torch.nn.Module, device: Any) -> bool:
        return False if is_zero3_module(module) else original(module, device)

    return can_module_be_deep_cloned


def sparsity_hooks_as_list(original: Callable) -> Callable:
    """ORT's installers of the export-time sparsity checks return None when the optimizer they serve is off, and
    the export then iterates over what they returned: with ORTMODULE_ENABLE_COMPUTE_OPTIMIZER=0 (which turns both
    optimizers off) every export fails with "'NoneType' object is not iterable". No hooks are an empty list."""

    @functools.wraps(original)
    def installed_hooks(*args: Any, **kwargs: Any) -> list:
        hooks = original(*args, **kwargs)
        return [] if hooks is None else hooks

    return installed_hooks


def configure_hooks(original: Callable) -> Callable:
    """ORT's ZeRO-3 hook setup fails at import on DeepSpeed >= 0.14; ort_zero's subscriber does that job."""

    def configure_ort_compatible_zero_stage3(*args: Any, **kwargs: Any) -> None:
        logger.info("ort_zero: ORT's ZeRO-3 hook configuration is replaced by ort_zero's subscriber")

    return configure_ort_compatible_zero_stage3


def post_export_process(original: Callable) -> Callable:
    """Runs ORT's post-export processing without its ZeRO-3 and gradient passes, then ort_zero's export passes
    (`passes.pipeline`)."""

    @functools.wraps(original)
    def _post_export_process(
        flatten_module: torch.nn.Module,
        export_mode: int,
        exported_model_info: Any,
        model_info_for_export: Any,
        enable_custom_autograd_function: bool,
        enable_zero_stage3_support: bool,
        run_symbolic_shape_infer: bool,
        stage3_param_handle: Any,
        enable_mem_efficient_grad_management: bool,
        logger: logging.Logger,
    ) -> Any:
        info = original(
            flatten_module,
            export_mode,
            exported_model_info,
            model_info_for_export,
            enable_custom_autograd_function,
            False,
            run_symbolic_shape_infer,
            stage3_param_handle,
            False,
            logger,
        )
        exported = ExportedGraph(
            model=ortmodule.post_export_model(info),
            module=flatten_module,
            training=export_mode == torch.onnx.TrainingMode.TRAINING,
            mem_efficient_grads=enable_mem_efficient_grad_management or settings.mem_efficient_grads,
        )
        run_export_passes(exported)
        if exported.mem_efficient_order:
            ortmodule.order_for_mem_efficient_grads(info)
        if exported.removed_inputs:
            ortmodule.add_graph_input(
                info,
                TRIGGER_NAME,
                exported.removed_inputs,
                _trigger_tensor,
                ort_declares_grad_input=enable_zero_stage3_support,
            )
        return info

    return _post_export_process


def loud_fallback(original: Callable) -> Callable:
    """A fallback the user allowed (ORTMODULE_FALLBACK_POLICY) is announced on every rank, not only in ORT's log.
    The model then runs in PyTorch, whose views must own their memory: its bridges forget its graph's buffer plans."""

    @functools.wraps(original)
    def fallback(self: Any, log_level: Any, *inputs: Any, **kwargs: Any) -> Any:
        if (plans := ortmodule.kept_for_fallback(self, "buffer_plans")) is not None:
            plans.forget()
        if not ortmodule.mark(self, "announced"):
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else os.environ.get("RANK", 0)
            error = ortmodule.fallback_exception(self)
            message = (
                f"ort_zero: rank {rank}: ORTModule FELL BACK TO PYTORCH ({type(error).__name__}: "
                f"{error}). This model is not running in ONNX Runtime. Unset ORTMODULE_FALLBACK_POLICY "
                "(ort_zero then disables fallback) to make this an error."
            )
            logger.error(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return original(self, log_level, *inputs, **kwargs)

    return fallback


def session_options(original: Callable) -> Callable:
    """ORTModule leaves ORT's intra-op pool at all cores per process: N ranks on one machine oversubscribe it.

    With ORT_ZERO_CPU_MEM_ARENA=0 ORT's CPU arena is off: the arena keeps its high-water mark, grown in powers of
    two, so a process's memory shows neither what a step needs nor what a memory optimization saves. With
    ORT_ZERO_ORT_PROFILE=<prefix> ORT's profiler records every node's time, written to <prefix>_<date>.json
    by the session's `end_profiling()`."""

    @functools.wraps(original)
    def _get_session_config(self: Any) -> Any:
        session_options, providers, provider_options = original(self)
        session_options.intra_op_num_threads = threads_per_rank()
        if os.environ.get("ORT_ZERO_CPU_MEM_ARENA", "1") == "0":
            session_options.enable_cpu_mem_arena = False
        if profile_prefix := os.environ.get("ORT_ZERO_ORT_PROFILE"):
            session_options.enable_profiling = True
            session_options.profile_file_prefix = profile_prefix
        return session_options, providers, provider_options

    return _get_session_config


def threads_per_rank() -> int:
    """OMP_NUM_THREADS when set (torchrun and the deepspeed launcher set it), else this rank's share of the cores."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")))
    return max(1, len(os.sched_getaffinity(0)) // max(1, local_ranks))


def _trigger_tensor(args: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    if TRIGGER_NAME in kwargs:  # ORTModule made it (ORTMODULE_ENABLE_ZERO_STAGE3=1)
        return kwargs[TRIGGER_NAME]
    device = next((t.device for t in args if isinstance(t, torch.Tensor)), torch.device("cpu"))
    return torch.zeros(1, device=device).requires_grad_(torch.is_grad_enabled())
