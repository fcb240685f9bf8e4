"""ORTModule's `GraphTransitionManager` and `_io`, where a model is exported: the export context, the output-schema
forward, the deep-clone check, the sparsity hooks and the post-export processing, replaced for ZeRO-3 models.

Each function takes the original ORT object and returns its replacement (the registry's factory protocol).
"""

from __future__ import annotations

import contextlib
import functools
import logging
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
from ..export.groups import during_export
from ..passes.base import ExportedGraph
from ..passes.pipeline import run_export_passes
from ..passes.zero3_params import TRIGGER_NAME

logger = logging.getLogger(__name__)


def export_context(original: Callable) -> Callable:
    """Replaces `stage3_export_context`: ORT's needs `torch.onnx._internal._beartype`, gone in torch >= 2.5.

    Every export (ZeRO-3 or not) runs inside it, so export failures name their module. A ZeRO-3 export also runs
    inside `during_export(module)` (the export-time patch groups: torch's own F.linear, and rewrites of the
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


def schema_forward(original: Callable) -> Callable:
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
                with torch_internals.fake_tensors(), warnings.catch_warnings(), _buffers_kept(flattened_module):
                    # ORTModule deep-copies the inputs, and torch's deepcopy asks a fake copy for its data pointer
                    warnings.filterwarnings("ignore", "Accessing the data pointer of FakeTensor", UserWarning)
                    return original(flattened_module, *args, **kwargs)
            except Exception as error:  # noqa: BLE001  (any failure on fake tensors: the real forward decides)
                logger.debug("ort_zero: the output-schema forward needs real tensors (%s)", error)
            return original(flattened_module, *args, **kwargs)

    return parse_outputs


@contextlib.contextmanager
def _buffers_kept(module: torch.nn.Module) -> Iterator[None]:
    """Puts back every buffer a forward on fake tensors replaced: a model that stores a converted buffer in its
    forward (CTRL's `self.pos_encoding = self.pos_encoding.to(dtype)`, a copy in bf16) would keep a fake one, and the
    trace would then meet it as a constant without data."""
    kept = [(owner, name, buffer) for owner in module.modules() for name, buffer in owner.named_buffers(recurse=False)]
    try:
        yield
    finally:
        for owner, name, buffer in kept:
            setattr(owner, name, buffer)  # a registered buffer's name: set as that buffer again


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


def _trigger_tensor(args: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    if TRIGGER_NAME in kwargs:  # ORTModule made it (ORTMODULE_ENABLE_ZERO_STAGE3=1)
        return kwargs[TRIGGER_NAME]
    device = next((t.device for t in args if isinstance(t, torch.Tensor)), torch.device("cpu"))
    return torch.zeros(1, device=device).requires_grad_(torch.is_grad_enabled())
