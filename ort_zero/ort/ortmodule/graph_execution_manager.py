"""ORTModule's `GraphExecutionManager`, where sessions are configured and run: its session options (threads per rank,
the arena, the profiler, whose files are written at exit), its fallback to PyTorch (announced on every rank), and
the ZeRO-3 hook setup it calls (`configure_ort_compatible_zero_stage3`, replaced by ort_zero's subscriber).

Each function takes the original ORT object and returns its replacement (the registry's factory protocol).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ...foreign import onnxruntime as ort_internals
from ...memory import arena
from ..graph.widening import declares_16_bit, widened_record
from ..passes.half_precision_casts import UnsupportedOpError, missing_kernel_message, node_location
from ..passes.recompute import recompute_record

logger = logging.getLogger(__name__)
DISABLED_OPTIMIZERS = "optimization.disable_specified_optimizers"  # ORT's session option: names, comma-separated


def configure_hooks(original: Callable) -> Callable:
    """ORT's ZeRO-3 hook setup fails at import on DeepSpeed >= 0.14; ort_zero's subscriber does that job."""

    def configure_ort_compatible_zero_stage3(*args: Any, **kwargs: Any) -> None:
        logger.info("ort_zero: ORT's ZeRO-3 hook configuration is replaced by ort_zero's subscriber")

    return configure_ort_compatible_zero_stage3


def loud_fallback(original: Callable) -> Callable:
    """A fallback the user allowed (ORTMODULE_FALLBACK_POLICY) is announced on every rank, not only in ORT's log.
    The model then runs in PyTorch, whose views must own their memory: its bridges forget its graph's buffer plans."""

    @functools.wraps(original)
    def fallback(self: Any, log_level: Any, *inputs: Any, **kwargs: Any) -> Any:
        if (plans := ort_internals.kept_for_fallback(self, "buffer_plans")) is not None:
            plans.forget()
        if not ort_internals.mark(self, "announced"):
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else os.environ.get("RANK", 0)
            error = ort_internals.fallback_exception(self)
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

    A graph with float32 fallbacks for 16-bit nodes runs without common-subexpression elimination
    (`passes.half_precision_casts` says why). ORT's CPU arena is kept or not as `cpu_arena_kept` decides; the
    process's cached CPU provider is forgotten first for a CPU model, or its session would get the arena of whichever
    session came first (ort_zero's kernel probes, another model's). With
    ORT_ZERO_ORT_PROFILE=<prefix> ORT's profiler records every node's time, written to
    <prefix>[_rank<R>]_<date>.json (`profile_written_at_exit`)."""

    @functools.wraps(original)
    def _get_session_config(self: Any) -> Any:
        session_options, providers, provider_options = original(self)
        session_options.intra_op_num_threads = threads_per_rank()
        session_options.enable_cpu_mem_arena = session_options.enable_cpu_mem_arena and cpu_arena_kept(self)
        if widened_record(graph_of(self)):  # the backward's widening Casts stay apart from the forward's
            session_options.add_session_config_entry(DISABLED_OPTIMIZERS, "CommonSubexpressionElimination")
        if prefix := profile_prefix():
            session_options.enable_profiling = True
            session_options.profile_file_prefix = prefix
        if ort_internals.device(self).type == "cpu":  # CUDA's sessions keep sharing their cached providers
            ort_internals.forget_cpu_provider()
        return session_options, providers, provider_options

    return _get_session_config


def cpu_arena_kept(manager: Any) -> bool:
    """Whether the manager's session keeps ORT's CPU arena (`memory.arena` decides from the graph it will run)."""
    on_cpu = ort_internals.device(manager).type == "cpu"
    graph = graph_of(manager) if on_cpu else None
    kept, because = arena.cpu_arena_kept(
        on_cpu,
        recomputes_layers=on_cpu and bool(recompute_record(graph)["layers"]),
        sixteen_bit=on_cpu and declares_16_bit(graph),
    )
    if because:
        logger.info("ort_zero: ORT's CPU arena off: %s (ORT_ZERO_CPU_MEM_ARENA=1 keeps it)", because)
    return kept


def graph_of(manager: Any) -> Any:
    """The graph the manager's session is about to run (None before ORTModule built one)."""
    model = ort_internals.optimized_model(manager)
    return model.graph if model is not None else None


def threads_per_rank() -> int:
    """OMP_NUM_THREADS when set (torchrun and the deepspeed launcher set it), else this rank's share of the cores."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")))
    return max(1, len(os.sched_getaffinity(0)) // max(1, local_ranks))


def profile_prefix() -> str | None:
    """ORT_ZERO_ORT_PROFILE, with the rank's number in a distributed run: ranks started in the same second would
    otherwise write one file."""
    prefix = os.environ.get("ORT_ZERO_ORT_PROFILE")
    rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
    return f"{prefix}_rank{rank}" if prefix and rank is not None else prefix


def profile_written_at_exit(original: Callable) -> Callable:
    """Wraps a manager's `_create_execution_agent`: ORT writes a session's profile when the session ends or is freed,
    and ORTModule's sessions usually live until the interpreter exits without freeing them (the file stayed empty).
    With the profiler on, each session's profile is ended at exit; one freed before has written its own. The profile of
    the session ORT builds only to probe its memory optimizer is removed: it ran nothing, and started in another
    second than the real session it left a second file."""

    @functools.wraps(original)
    def _create_execution_agent(self: Any) -> None:
        if not profile_prefix():
            original(self)
            return
        with ort_internals.memory_probe_unprofiled(self):
            original(self)
        atexit.register(_end_profiling, weakref.ref(ort_internals.session(self)))

    return _create_execution_agent


def _end_profiling(session: weakref.ref) -> None:
    if (alive := session()) is not None:
        logger.info("ort_zero: ORT's profile written to %s", alive.end_profiling())


_NO_KERNEL = re.compile(r"NOT_IMPLEMENTED : Could not find an implementation for (\w+)\(\d+\) node with name '([^']*)'")
_TYPE_ERROR = re.compile(
    r"Type Error: Type 'tensor\((\w+)\)' of input parameter \(([^)]*)\) of operator \((\w+)\) in node \(([^)]*)\)"
)
_INLINED = re.compile(r"_inlfunc_([A-Za-z0-9]+)_")  # a value of an ORT function's body, inlined: "_inlfunc_DivGrad_.."


def refusal_named(error: Exception, device: str) -> str | None:
    """The one line for ORT's refusal of a graph (no kernel for a node's types, or an op its schemas or its
    gradient's do not take in a dtype): the op, the module and the way out; None for any other error."""
    if (found := _NO_KERNEL.search(str(error))) is not None:
        op_type, node_name = found.groups()
        return missing_kernel_message(op_type, node_name, device, "the types it is given") + (
            ": a bf16/fp16 model trains in float32 in ORT without the DeepSpeed config's bf16/fp16 section; "
            "otherwise leave that module out of ORTModule"
        )
    if (found := _TYPE_ERROR.search(str(error))) is not None:
        dtype, value, op_type, node_name = found.groups()
        inlined = _INLINED.match(value)
        op = f"{op_type} (in {inlined.group(1)})" if inlined else op_type
        return (
            f"ort_zero: ONNX Runtime cannot build {op} in {dtype} ({node_location(node_name or value)}): train this "
            f"model in float32 in ORT (no {dtype} section in the DeepSpeed config), or leave that module out of "
            "ORTModule"
        )
    return None


def ort_refusals_named(original: Callable) -> Callable:
    """Wraps a manager's method that builds a graph or a session (`_initialize_graph_builder`, `_build_graph`,
    `_create_execution_agent`): ORT's refusal of the graph, a traceback from deep inside ORT, becomes one line
    (`refusal_named`)."""

    @functools.wraps(original)
    def building(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception as error:
            if (message := refusal_named(error, ort_internals.device(self).type)) is None:
                raise
            raise UnsupportedOpError(message) from None

    return building
