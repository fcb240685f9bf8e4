"""A Function's call as a PythonOp ORT can run, at step time: tensor outputs only, one gradient per input.

`ort_zero.ort.export.autograd` says why and when a model's autograd Functions are wrapped so (`with_tensor_outputs`)
while a ZeRO-3 model is exported; the wrapper's forward and backward, and the layout that hands a call's non-tensor
outputs back to its caller and checks them at every run in ORT, are here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...python_op import function_name

_CONSTANTS = (type(None), bool, int, float, str)


def _shaped_like_input(index: int) -> Callable[..., tuple[list, list]]:
    """ORT's `infer_shape` callback for a Function whose one output has the shape and type of its `index`th tensor."""

    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        return [shapes[index]], [dtypes[index]]

    return infer_shape


# Output shapes declared for Functions (by ORT's qualified name) that ORT must know and that the Functions lack.
OUTPUT_SHAPES: dict[str, Callable[..., tuple[list, list]]] = {
    # PhimoeMultiplier(scores, multiplier, selected_experts, masked_gates, mask_for_one) = multiplier * mask_for_one
    "transformers.models.phimoe.modeling_phimoe.PhimoeMultiplier": _shaped_like_input(1),
}


def _is_constant(value: Any) -> bool:
    if isinstance(value, tuple | list):
        return all(_is_constant(item) for item in value)
    return isinstance(value, _CONSTANTS)


@dataclass(frozen=True)
class _Constant:
    """A non-tensor output as the export saw it; equal to another by type and value (`repr`: NaN equals NaN)."""

    value: Any

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Constant) and (type(self.value), repr(self.value)) == (
            type(other.value),
            repr(other.value),
        )

    def __hash__(self) -> int:
        return hash(repr(self.value))


class OutputLayout:
    """One call's outputs: the dtype of each tensor, and the non-tensor ones as the export saw them. Passed to the
    wrapper's forward as its last argument, so ORT keeps this object with the PythonOp and hands it to each run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.single = False  # the Function returns one object, not a tuple
        self.exported: tuple[torch.dtype | _Constant, ...] | None = None  # one per output, from the export
        self.bool_inputs: set[int] = set()  # ORT 1.19.2's DLPack has no bool: they cross into the PythonOp as uint8

    def tensors(self, outputs: Any) -> tuple[torch.Tensor, ...]:
        """The tensor outputs (bools as uint8); records the others at the first call (the export) and checks them at
        every later one (the runs in ORT)."""
        items = (outputs,) if not isinstance(outputs, tuple) else outputs
        if self.exported is None:
            self.single = not isinstance(outputs, tuple)
            self.exported = tuple(self._key(position, item) for position, item in enumerate(items))
            if all(isinstance(key, _Constant) for key in self.exported):
                raise TypeError(f"ort_zero: autograd Function {self.name} returns no tensor: ORT cannot run it")
        else:  # a number where the trace had a tensor: a size, which a trace records as a tensor
            items = tuple(
                torch.tensor(item, dtype=key)
                if isinstance(key, torch.dtype) and isinstance(item, int | float)
                else item
                for key, item in zip(self.exported, items, strict=False)
            )
            keys = tuple(self._key(position, item) for position, item in enumerate(items))
            if self._shown(keys) != self._shown(self.exported):
                raise RuntimeError(
                    f"ort_zero: autograd Function {self.name} returned ({self._shown(keys)}) where ORT's graph has "
                    f"({self._shown(self.exported)}) from the export: ORT keeps a non-tensor output as the constant "
                    "it was when the model was exported, and this one changes with the data; return it as a tensor"
                )
        tensors = (item for item in items if isinstance(item, torch.Tensor))
        return tuple(t.to(torch.uint8) if t.dtype == torch.bool else t for t in tensors)

    def _key(self, position: int, item: Any) -> torch.dtype | _Constant:
        if isinstance(item, torch.Tensor):
            return item.dtype
        if not _is_constant(item):
            raise TypeError(
                f"ort_zero: autograd Function {self.name} returns a {type(item).__name__} as output {position}: an "
                "ORT PythonOp outputs tensors, and ort_zero keeps constants (None, numbers, strings) outside its "
                "graph; return it as a tensor"
            )
        return _Constant(item)

    @staticmethod
    def _shown(keys: tuple[torch.dtype | _Constant, ...]) -> str:
        return ", ".join(repr(key.value) if isinstance(key, _Constant) else "<tensor>" for key in keys)

    def outputs(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        """The Function's outputs as it returned them: its tensors (bools again), and the constants where they were."""
        assert self.exported is not None, "the layout is known once the forward ran"
        remaining = iter(tensors)
        items = tuple(key.value if isinstance(key, _Constant) else next(remaining).to(key) for key in self.exported)
        return items[0] if self.single else items

    def gradients(self, grads: tuple[Any, ...]) -> tuple[Any, ...]:
        """A gradient per output of the Function: the tensors' as given, None for the constants (as PyTorch does)."""
        assert self.exported is not None, "the layout is known once the forward ran"
        remaining = iter(grads)
        return tuple(None if isinstance(key, _Constant) else next(remaining) for key in self.exported)


def _input_meta(arg: Any) -> tuple | None:
    if isinstance(arg, torch.Tensor) and arg.is_floating_point():
        return arg.shape, arg.dtype, arg.device
    return None


@functools.cache  # one class per Function: ORT registers a PythonOp's Function by its name at each export
def with_tensor_outputs(function: type[torch.autograd.Function]) -> type[torch.autograd.Function]:
    """A Function that runs `function` with tensor outputs only and one gradient per input (module docstring)."""
    name = function_name(function)
    setup_apart = function.setup_context is not torch.autograd.Function.setup_context

    def forward(ctx: Any, *args: Any) -> tuple[torch.Tensor, ...]:
        *inputs, layout = args
        inputs = [arg.bool() if i in layout.bool_inputs else arg for i, arg in enumerate(inputs)]
        if setup_apart:  # forward without ctx, then setup_context (PyTorch's second way to write a Function)
            outputs = function.forward(*inputs)
            function.setup_context(ctx, tuple(inputs), outputs)
        else:
            outputs = function.forward(ctx, *inputs)
        ctx.ort_zero_layout = layout
        ctx.ort_zero_inputs = [_input_meta(arg) for arg in inputs]
        return layout.tensors(outputs)

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        results = function.backward(ctx, *ctx.ort_zero_layout.gradients(grads))
        results = results if isinstance(results, tuple) else (results,)
        count = len(ctx.ort_zero_inputs)
        if len(results) < count or any(extra is not None for extra in results[count:]):
            raise RuntimeError(f"ort_zero: {name}'s backward returned {len(results)} gradients for {count} inputs")
        wanted = ctx.needs_input_grad
        return (
            *(
                torch.zeros(meta[0], dtype=meta[1], device=meta[2]) if grad is None and meta and wanted[i] else grad
                for i, (grad, meta) in enumerate(zip(results[:count], ctx.ort_zero_inputs, strict=True))
            ),
            None,  # the layout
        )

    members: dict[str, Any] = {
        "forward": staticmethod(forward),
        "backward": staticmethod(backward),
        "__module__": function.__module__,
        "__qualname__": f"{function.__qualname__}.WithTensorOutputs",
        "__doc__": f"{name} with tensor outputs only and one gradient per input (ort_zero.ort.step.tensor_outputs).",
        "wrapped_by_ort_zero": function,
    }
    infer_shape = getattr(function, "infer_shape", None) or OUTPUT_SHAPES.get(name)
    if infer_shape is not None:
        members["infer_shape"] = staticmethod(infer_shape)
    # a direct subclass of Function: ORT registers no other kind of class for a PythonOp
    return type(f"{function.__name__}WithTensorOutputs", (torch.autograd.Function,), members)
