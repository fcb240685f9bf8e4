"""Autograd Functions through which every ZeRO-3 gather and release runs.

The ONNX exporter turns each into a PythonOp, so ONNX Runtime calls back into DeepSpeed at the same points as
PyTorch does. They are defined once, here (ORT keys PythonOps by qualified class name), take the module as an integer
key (see `state.py`) and never run a collective while the model is being traced for export.

    StepStartBridge    outermost inputs     forward: coordinator reset_step
    PreForwardBridge   module inputs        forward: gather params (+ return them full-sized for ORT)
                                            backward: ORT's param grads to DeepSpeed, then release after backward
    PostForwardBridge  module outputs       forward: release params; backward: gather for the module's backward

The bridges that only ORT graphs have live beside the passes that insert them: `BackwardParamsBridge`
(`ort_zero.ort.passes.backward_gather`), `RecomputeStartBridge` and `RecomputeParamsBridge`
(`ort_zero.ort.passes.recompute_bridges`).
"""

from __future__ import annotations

from typing import Any

import torch
from deepspeed.runtime.zero.partition_parameters import register_external_parameter, unregister_external_parameter
from deepspeed.utils import z3_leaf_module

from .. import python_op
from ..foreign import deepspeed as ds_internals
from ..foreign import torch as torch_internals
from ..hooks import is_exporting, passthrough
from . import grad_handoff
from . import state as zero3_state


class StepStartBridge(torch.autograd.Function):
    """Start of a forward: DeepSpeed's parameter coordinator begins a new step (its trace, its prefetch queue)."""

    @staticmethod
    def forward(ctx: Any, key: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not is_exporting():
            zero3_state.lookup(key).offload.get_param_coordinator().reset_step()
        return passthrough.passed_through(ctx, StepStartBridge, (key,), tensors)

    backward = staticmethod(passthrough.keyed_backward)
    infer_shape = staticmethod(python_op.same_shapes)
    alias_input = staticmethod(passthrough.keyed_alias_input)


class PreForwardBridge(torch.autograd.Function):
    """Before a module's forward: gather its parameters.

    `tensors` are the module's input tensors followed, in an exported graph only, by one tensor per partitioned
    parameter. With those, the bridge returns the full-sized parameters after the inputs; the graph rewrite makes
    the module's ops read them, so their gradients come back here and are handed to PyTorch with
    DeepSpeed's gradient hooks while the parameters are still gathered (`grad_handoff`).
    """

    @staticmethod
    def forward(ctx: Any, key: int, input_count: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        module_state = zero3_state.lookup(key)
        ctx.key, ctx.input_count = key, input_count
        ctx.counted = any(ctx.needs_input_grad[2 : 2 + input_count])
        ctx.placeholders = [(t.shape, t.dtype, t.device) for t in tensors[input_count:]]
        if not is_exporting():
            # Counted afresh at every forward, as DeepSpeed does: a checkpoint's recompute forward (whose graph no
            # backward runs) or a forward whose backward was cut short must not leave a count nothing takes away.
            module_state.grads_remaining = 1 if ctx.counted else 0
            module_state.offload.pre_sub_module_forward_function(module_state.module)
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
            for param, grad in zip(module_state.bridged_params(), param_grads, strict=False):
                if grad is not None and param.requires_grad:
                    grad_handoff.hand_over(param, grad)
            if z3_leaf_module(module_state.module):
                _run_leaf_reduce_hooks(module_state.module)
        if ctx.counted:
            module_state.grads_remaining -= 1
            if module_state.grads_remaining == 0:
                module_state.offload.post_sub_module_backward_function(module_state.module)
        placeholder_grads = [
            torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.placeholders
        ]
        return (None, None, *passthrough.input_grads(ctx, grads[: ctx.input_count]), *placeholder_grads)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """ORT shape inference: inputs pass through; the trailing outputs are full-sized parameters."""
        key = python_op.int_scalars(node)[0]
        params = zero3_state.lookup(key).bridged_params()
        if params:
            start = len(shapes) - len(params)
            shapes = shapes[:start] + [list(p.ds_shape) for p in params]
            dtypes = dtypes[:start] + [python_op.onnx_dtype(p.dtype) for p in params]
        return shapes, dtypes

    @staticmethod
    def alias_input(node_proto: bytes) -> tuple[list, list]:
        """Module inputs pass through; the full-sized parameters after them are new tensors."""
        passed_through = python_op.int_scalars(python_op.parse_node(node_proto))[1]
        return python_op.alias_maps(node_proto, non_tensor_inputs=2, passed_through=passed_through)


class PostForwardBridge(torch.autograd.Function):
    """After a module's forward: release its parameters; before its backward: gather them again."""

    @staticmethod
    def forward(ctx: Any, key: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        module_state = zero3_state.lookup(key)
        ctx.key = key
        ctx.counted = any(ctx.needs_input_grad[1:])
        if not is_exporting():
            release_after_forward(module_state)
            if ctx.counted:
                module_state.pending_pre_backward += 1
        return passthrough.passed_through(ctx, PostForwardBridge, (key,), tensors)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        module_state = zero3_state.lookup(ctx.key)
        if ctx.counted and module_state.pending_pre_backward > 0:
            module_state.pending_pre_backward -= 1
            module_state.offload.pre_sub_module_backward_function(module_state.module)
        return (None, *passthrough.input_grads(ctx, grads))

    infer_shape = staticmethod(python_op.same_shapes)
    alias_input = staticmethod(passthrough.keyed_alias_input)


def release_after_forward(module_state: zero3_state.ModuleState) -> None:
    """DeepSpeed's post-forward: leave the module on the forward stack, hand the parameters it returned to the
    enclosing module, then release its parameters."""
    ds_internals.forward_module_stack().pop()
    for param in module_state.returned_params:
        hand_to_enclosing_module(module_state.module, param)
    module_state.offload.post_sub_module_forward_function(module_state.module)


def hand_to_enclosing_module(module: torch.nn.Module, param: torch.nn.Parameter) -> None:
    """A parameter `module` returned is used after `module` ends, as DeepSpeed handles it: unless a module still
    running has it already, it becomes an external parameter of the innermost one (leaving `module`'s, which the
    enclosing module now covers) and stays gathered; external parameters are never released after a module."""
    running = ds_internals.forward_module_stack()
    if any(ds_internals.has_external_param(m, param) for m in running):
        return
    param.is_external_param = True
    register_external_parameter(running[-1], param)
    if ds_internals.has_external_param(module, param):
        unregister_external_parameter(module, param)
    param.all_gather()


def _run_leaf_reduce_hooks(module: torch.nn.Module) -> None:
    """DeepSpeed reduces a z3 leaf module's gradients in a full backward hook on the module, which cannot fire
    when the module's backward runs inside ORT; run it here, once its parameters have their gradients."""
    for hook in torch_internals.full_backward_hooks(module):
        hook(module, (), ())


BRIDGES: tuple[type[torch.autograd.Function], ...] = (StepStartBridge, PreForwardBridge, PostForwardBridge)
"""The bridges the exporter traces; BackwardParamsBridge is only ever inserted into ORT's training graph."""
