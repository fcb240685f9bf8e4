"""ORTModule's `GraphTransitionManager` and `_io`, where a model is exported: the export context, the export itself
(one forward, the trace), the deep-clone check, the sparsity hooks and the post-export processing, replaced for
ZeRO-3 models.

Each function takes the original ORT object and returns its replacement (the registry's factory protocol).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import logging
from collections.abc import Callable, Iterator
from typing import Any

import onnx
import torch

from ... import settings
from ...foreign import onnxruntime as ort_internals
from ...zero3 import external_params
from ..export.context import is_zero3_module, stood_in_for_export
from ..export.errors import naming_export_failures
from ..export.groups import during_export
from ..export.source_ranges import compared_source_ranges_only
from ..passes.base import ExportedGraph
from ..passes.pipeline import run_export_passes
from ..passes.zero3_params import TRIGGER_NAME
from . import torch_compat

logger = logging.getLogger(__name__)


def export_context(original: Callable) -> Callable:
    """Replaces `stage3_export_context`: ORT's needs `torch.onnx._internal._beartype`, gone in torch >= 2.5.

    Every export (ZeRO-3 or not) runs inside it, so export failures name their module. A ZeRO-3 export also runs
    inside `during_export(module)` (the export-time patch groups: torch's own F.linear, and rewrites of the
    model code the module runs)."""

    @contextlib.contextmanager
    def zero3_export_context(enable: bool, stage3_param_handle: Any, flattened_module: torch.nn.Module) -> Iterator:
        with _exporting(flattened_module):
            yield

    return zero3_export_context


@contextlib.contextmanager
def _exporting(flattened_module: torch.nn.Module) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        stack.enter_context(naming_export_failures(flattened_module))
        if is_zero3_module(flattened_module):
            stack.enter_context(during_export(flattened_module))
            stack.enter_context(stood_in_for_export(flattened_module))
        yield


def exported_in_one_forward(original: Callable) -> Callable:
    """Replaces `GraphTransitionManager._get_exported_model` for ZeRO-3 models: ORT runs a model's forward to read
    its outputs' structure, then traces it, a second forward (MoE 87M at seq 512: 0.35 s of a 1.5-s export). Here the
    trace is the only forward: torch reads the outputs' names and dynamic axes only once it has traced, so they are
    filled in as the traced forward returns, and the structure is the one that forward kept. ORT's export cache
    (ORTMODULE_CACHE_DIR) has no structure to give back without that forward: not used for ZeRO-3 models."""

    @functools.wraps(original)
    def get_exported_model(**options: Any) -> tuple[onnx.ModelProto, Any]:
        flattened_module = options["flattened_module"]
        if not is_zero3_module(flattened_module):
            return original(**options)
        if options["ortmodule_cache_dir"]:
            _say_the_cache_is_unused()
        model, found_external_params = _traced(flattened_module, options)
        if found_external_params:  # registered now: their readers' bridges gather them in the graph traced again
            model, _ = _traced(flattened_module, options)
        return model, ort_internals.output_schema(flattened_module)

    return get_exported_model


@functools.cache
def _say_the_cache_is_unused() -> None:
    """Once per process (every export would repeat it)."""
    logger.warning("ort_zero: ORTMODULE_CACHE_DIR is not used for ZeRO-3 models: each of their exports traces them")


def _traced(flattened_module: torch.nn.Module, options: dict[str, Any]) -> tuple[onnx.ModelProto, bool]:
    """The ONNX model torch's trace writes, and whether the trace found parameters read outside their modules."""
    info = options["model_info_for_export"]
    output_names: list[str] = []
    dynamic_axes = copy.deepcopy(info.onnx_graph_input_dynamic_axes_map)

    def name_outputs(module: torch.nn.Module, args: Any, outputs: list[torch.Tensor]) -> None:
        for index, output in enumerate(outputs):
            name = f"output-{index}"
            output_names.append(name)
            dynamic_axes[name] = {dim: f"{name}_dim{dim}" for dim in range(output.dim())}

    exported = io.BytesIO()
    inputs = copy.deepcopy(tuple(_detached(value) for value in options["flatten_module_inputs"]))
    handle = flattened_module.register_forward_hook(name_outputs)
    try:
        with (
            torch.no_grad(),
            _exporting(flattened_module),
            external_params.discovering() as discovery,
            compared_source_ranges_only(),
        ):
            torch_compat.torchscript_export(
                torch.onnx.export, flattened_module, inputs, exported,
                input_names=info.onnx_graph_input_names, output_names=output_names, dynamic_axes=dynamic_axes,
                opset_version=options["onnx_opset_version"], training=info.export_mode, do_constant_folding=False,
                export_params=False, keep_initializers_as_inputs=True, verbose=options["torch_exporter_verbose_log"],
                autograd_inlining=not options["enable_custom_autograd_function"], **info.export_extra_kwargs,
            )  # fmt: skip
    except Exception as error:
        raise ort_internals.export_failure(error) from error
    finally:
        handle.remove()
    return onnx.load_model_from_string(exported.getvalue()), bool(discovery.found)


def _detached(value: Any) -> Any:
    """An input as the trace gets it: its data, asking for a gradient where the input does (the forward may change
    its inputs in place: the trace runs on copies)."""
    return value.detach().requires_grad_(value.requires_grad) if isinstance(value, torch.Tensor) else value


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
            model=ort_internals.post_export_model(info),
            module=flatten_module,
            training=export_mode == torch.onnx.TrainingMode.TRAINING,
            mem_efficient_grads=enable_mem_efficient_grad_management or settings.mem_efficient_grads,
        )
        run_export_passes(exported)
        if exported.mem_efficient_order:
            ort_internals.order_for_mem_efficient_grads(info)
        if exported.removed_inputs:
            ort_internals.add_graph_input(
                info,
                TRIGGER_NAME,
                exported.removed_inputs,
                _trigger_tensor,
                ort_declares_grad_input=enable_zero_stage3_support,
            )
        return info

    return _post_export_process


def _trigger_tensor(args: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    if TRIGGER_NAME in kwargs:  # ORTModule made it (ORTMODULE_ENABLE_ZERO_STAGE3=1)
        return kwargs[TRIGGER_NAME]
    device = next((t.device for t in args if isinstance(t, torch.Tensor)), torch.device("cpu"))
    return torch.zeros(1, device=device).requires_grad_(torch.is_grad_enabled())
