"""Autograd Functions through which every ZeRO-3 gather and release runs.

The ONNX exporter turns each into a PythonOp, so ONNX Runtime calls back into DeepSpeed at the same points as
PyTorch does. They are defined once, here (ORT keys PythonOps by qualified class name), take the module as an integer
key (see `state.py`) and never run a collective while the model is being traced for export.

    StepStartBridge    outermost inputs     forward: coordinator reset_step
    PreForwardBridge   module inputs        forward: gather params (+ return them full-sized for ORT)
                                            backward: ORT's param grads to DeepSpeed, then release after backward
    PostForwardBridge  module outputs       forward: release params; backward: gather for the module's backward

Each is a pass-through to its module's `ModuleState` (`state.py`), where every gather and release is. The bridges
only ORT's training graph has are in `ort_bridges.py`.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import python_op
from ..hooks import is_exporting, passthrough
from . import state as zero3_state
from .bridge_nodes import BridgeNode


@python_op.records_errors
class StepStartBridge(torch.autograd.Function):
    """Start of a forward: DeepSpeed's parameter coordinator begins a new step (its trace, its prefetch queue)."""

    SCALARS = ("key",)  # its PythonOp's integer arguments (`bridge_nodes`)

    @staticmethod
    def forward(ctx: Any, key: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if is_exporting():
            zero3_state.lookup(key).export_traced(outermost=True)
        else:
            zero3_state.lookup(key).start_step()
        return passthrough.passed_through(ctx, StepStartBridge, (key,), tensors)

    backward = staticmethod(passthrough.keyed_backward)
    infer_shape = staticmethod(python_op.same_shapes)
    alias_input = staticmethod(passthrough.keyed_alias_input)


@python_op.records_errors
class PreForwardBridge(torch.autograd.Function):
    """Before a module's forward: gather its parameters.

    `tensors` are the module's input tensors followed, in an exported graph only, by one tensor per partitioned
    parameter. With those, the bridge returns the full-sized parameters after the inputs; the graph rewrite makes
    the module's ops read them, so their gradients come back here and are handed to PyTorch with
    DeepSpeed's gradient hooks while the parameters are still gathered (`grad_handoff`).
    """

    SCALARS = ("key", "input_count")

    @staticmethod
    def forward(ctx: Any, key: int, input_count: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        module_state = zero3_state.lookup(key)
        ctx.key, ctx.input_count = key, input_count
        ctx.counted = any(ctx.needs_input_grad[2 : 2 + input_count])
        ctx.placeholders = [(t.shape, t.dtype, t.device) for t in tensors[input_count:]]
        if is_exporting():
            module_state.export_traced(outermost=False)
        ctx.call = None if is_exporting() else module_state.gather_for_forward()
        outputs = passthrough.passed_through(ctx, PreForwardBridge, (key, input_count), tensors[:input_count])
        if ctx.placeholders:
            params = module_state.bridged_params()
            if len(params) != len(ctx.placeholders):
                raise RuntimeError(
                    f"ort_zero: module {type(module_state.module).__name__} (ds_id {module_state.module.ds_id}) was "
                    f"exported with {len(ctx.placeholders)} partitioned parameters but now has {len(params)}"
                )
            outputs += tuple(p.detach().requires_grad_(p.requires_grad) for p in params)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        module_state = zero3_state.lookup(ctx.key)
        param_grads = grads[ctx.input_count :]
        if param_grads:
            module_state.gradients_arrived(param_grads)
        if ctx.counted and ctx.call is not None:
            module_state.backward_done(ctx.call)
        placeholder_grads = [
            torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.placeholders
        ]
        return (None, None, *passthrough.input_grads(ctx, grads[: ctx.input_count]), *placeholder_grads)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """ORT shape inference: inputs pass through; the trailing outputs are full-sized parameters."""
        params = zero3_state.lookup(BridgeNode(node, PreForwardBridge).key).bridged_params()
        if params:
            start = len(shapes) - len(params)
            shapes = shapes[:start] + [list(p.ds_shape) for p in params]
            dtypes = dtypes[:start] + [python_op.onnx_dtype(p.dtype) for p in params]
        return shapes, dtypes

    @staticmethod
    def alias_input(node_proto: bytes) -> tuple[list, list]:
        """Module inputs pass through; the full-sized parameters after them are new tensors."""
        passed_through = BridgeNode(python_op.parse_node(node_proto), PreForwardBridge).input_count
        return python_op.alias_maps(node_proto, non_tensor_inputs=2, passed_through=passed_through)


@python_op.records_errors
class PostForwardBridge(torch.autograd.Function):
    """After a module's forward: release its parameters; before its backward: gather them again."""

    SCALARS = ("key",)

    @staticmethod
    def forward(ctx: Any, key: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        module_state = zero3_state.lookup(key)
        ctx.key = key
        call = None if is_exporting() else module_state.release_after_forward()
        ctx.call = call if any(ctx.needs_input_grad[1:]) else None  # the call whose backward gathers again
        return passthrough.passed_through(ctx, PostForwardBridge, (key,), tensors)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        if ctx.call is not None:
            zero3_state.lookup(ctx.key).gather_for_backward(ctx.call)
        return (None, *passthrough.input_grads(ctx, grads))

    infer_shape = staticmethod(python_op.same_shapes)
    alias_input = staticmethod(passthrough.keyed_alias_input)


BRIDGES: tuple[type[torch.autograd.Function], ...] = (StepStartBridge, PreForwardBridge, PostForwardBridge)
"""The bridges the exporter traces; those of `ort_bridges.py` are only ever inserted into ORT's training graph."""
