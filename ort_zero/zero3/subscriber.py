"""ZeROOffloadSubscriber: DeepSpeed ZeRO-3's module hooks, expressed as bridge applications."""

from __future__ import annotations

import logging
from typing import Any

import torch
from deepspeed.runtime.zero.utils import is_zero_param
from deepspeed.utils import z3_leaf_module

from ..hooks import RunContext, SubscriberBase, flatten, is_exporting
from . import activation_checkpointing, external_params
from . import state as zero3_state
from .bridges import PostForwardBridge, PreForwardBridge, StepStartBridge
from .exported_order import ExportedOrder

logger = logging.getLogger(__name__)


class ZeROOffloadSubscriber(SubscriberBase):
    """Gathers and releases a module's parameters around its forward and backward, like DeepSpeed's own hooks.

    Modules below a z3 leaf module get no calls (the leaf gathers for them). Each hooked module has a
    `ModuleState`; the bridges find it through its integer key.
    """

    def __init__(self, offload: Any, root: torch.nn.Module) -> None:
        super().__init__()
        self.offload = offload
        self.states: dict[torch.nn.Module, zero3_state.ModuleState] = {}
        layers = {layer for layer in stacked_layers(root) if _on_cpu(layer)}
        clock, order = zero3_state.StepClock(), ExportedOrder()
        for module in hooked_modules(root):
            self.states[module] = zero3_state.register(module, offload, module in layers, clock, order)
        self.root_state = self.states[root]

    def close(self) -> None:
        for module_state in self.states.values():
            zero3_state.unregister(module_state)
        self.states.clear()

    def pre_forward_outermost_module(
        self, run_context: RunContext, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[tuple, dict[str, Any]]:
        flat = flatten((args, kwargs))
        carried = Carried(flat.tensors)
        if not carried.tensors:
            if not is_exporting():
                self.root_state.start_step()
            return args, kwargs
        return flat.rebuild(carried.merged(StepStartBridge.apply(self.root_state.key, *carried.tensors)))

    def pre_forward_module(
        self, run_context: RunContext, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[tuple, dict[str, Any]]:
        module_state = self.states.get(module)
        if module_state is None:
            return args, kwargs
        if is_exporting():
            external_params.entered(module_state)
        flat = flatten((args, kwargs))
        carried = Carried(flat.tensors)
        if is_exporting() and (running := activation_checkpointing.running_checkpoint()):
            # what the export-time patches cannot see (a non-reentrant checkpoint) meets the same policy here
            activation_checkpointing.on_checkpoint(running)
        # Only an export passes the parameters: their graph inputs then flow through the bridge for the rewrite.
        params = module_state.bridged_params() if is_exporting() else []
        if not carried.tensors and not params:
            if is_exporting():
                _warn_not_in_graph(module, "gather")
            else:
                module_state.gather_for_forward()
            return args, kwargs
        outputs = PreForwardBridge.apply(module_state.key, len(carried.tensors), *carried.tensors, *params)
        return flat.rebuild(_keep_param_aliases(flat.tensors, carried.merged(outputs[: len(carried.tensors)])))

    def post_forward_module(self, run_context: RunContext, module: torch.nn.Module, args: tuple, outputs: Any) -> Any:
        module_state = self.states.get(module)
        if module_state is None:
            return outputs
        if is_exporting():
            external_params.left(module_state)
        flat = flatten(outputs)
        returned = [p for p in map(_zero3_param_behind, flat.tensors) if p is not None]
        previous = list(map(id, module_state.returned_params))
        if is_exporting() and previous and previous != list(map(id, returned)):
            logger.warning(
                "ort_zero: %s returns other ZeRO-3 parameters than when it was first exported; inside ONNX Runtime "
                "the parameters of its last call are handed to the enclosing module",
                type(module).__name__,
            )
        module_state.returned_params = returned
        carried = Carried(flat.tensors)
        if not carried.tensors:
            if is_exporting():
                _warn_not_in_graph(module, "release")
            else:
                module_state.release_after_forward()
            return outputs
        released = carried.merged(PostForwardBridge.apply(module_state.key, *carried.tensors))
        return flat.rebuild(_keep_param_aliases(flat.tensors, released))


class Carried:
    """The tensors of a module boundary that its bridge carries: all but the bool ones, which pass around it. ORT
    1.19.2 hands a PythonOp's bool outputs back as uint8, and the next op that reads one as bool fails (a bool
    attention mask handed to a module: DeepSeek-V3.2's sparse-attention indexer); a bool tensor has no gradient,
    and the module's parameters come out of the bridge, so nothing that gathers or releases depends on it."""

    def __init__(self, tensors: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> None:
        self.all = tuple(tensors)
        self.positions = [index for index, tensor in enumerate(self.all) if tensor.dtype != torch.bool]
        self.tensors = tuple(self.all[index] for index in self.positions)

    def merged(self, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """All tensors again, the carried ones replaced by the bridge's `outputs` (in order)."""
        merged = list(self.all)
        for index, output in zip(self.positions, outputs, strict=True):
            merged[index] = output
        return tuple(merged)


def stacked_layers(root: torch.nn.Module) -> list[torch.nn.Module]:
    """A model's layers: the children of a ModuleList or Sequential that holds two or more of their type."""
    return [
        child
        for stack in root.modules()
        if isinstance(stack, (torch.nn.ModuleList, torch.nn.Sequential))
        for child in stack.children()
        if sum(type(other) is type(child) for other in stack.children()) >= 2
    ]


def _on_cpu(module: torch.nn.Module) -> bool:
    """Its parameters live on the CPU (their tensors, partitioned or not, are on the accelerator otherwise)."""
    return all(param.device.type == "cpu" for param in module.parameters())


def hooked_modules(root: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules that get ZeRO-3 calls: every module, except those below a z3 leaf module (pre-order)."""
    found: dict[torch.nn.Module, None] = {}

    def visit(module: torch.nn.Module) -> None:
        if module in found:
            return
        found[module] = None
        if not z3_leaf_module(module):
            for child in module.children():
                visit(child)

    visit(root)
    return list(found)


def _zero3_param_behind(tensor: torch.Tensor) -> torch.nn.Parameter | None:
    """The ZeRO-3 parameter a module output is, or stands for after an earlier module boundary."""
    if is_zero_param(tensor):
        return tensor
    return getattr(tensor, "ds_param_alias", None)


def _keep_param_aliases(inputs: tuple[torch.Tensor, ...], outputs: tuple[torch.Tensor, ...]) -> tuple:
    """A bridge hands back new tensors; where one stands for a ZeRO-3 parameter it says which (`ds_param_alias`,
    as DeepSpeed's hooks mark it), so later code can still find the parameter, its status and its owner."""
    for source, output in zip(inputs, outputs, strict=True):
        if is_zero_param(source):
            output.ds_param_alias = source
    return outputs


def _warn_not_in_graph(module: torch.nn.Module, what: str) -> None:
    logger.warning(
        "ort_zero: %s has no tensor %s; its ZeRO-3 %s cannot become part of the exported graph and will not run "
        "inside ONNX Runtime",
        type(module).__name__,
        "inputs or partitioned parameters" if what == "gather" else "outputs",
        what,
    )
