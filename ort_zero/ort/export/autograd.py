"""Any autograd Function in a model (the user's or a library's) exported as a PythonOp ORT can run and differentiate.

ORT 1.19.2 exports a Function's call as a PythonOp whose outputs must all be tensors, and its PythonOpGrad takes one
gradient per input, present wherever ORT differentiates the input. PyTorch is laxer, and libraries rely on it: TRL's
`ChunkedLogProbFunction` returns None for outputs it was not asked for (ORT's exporter records no rank for them and
its runner stops on `is_()`), PhiMoE's multiplier returns None gradients for inputs ORT differentiates (the gradient
node that reads them fails), Reformer's reversible layers return a trailing None beyond their inputs (ORT's
PythonOpGrad refuses the count). While a ZeRO-3 model is exported, `Function.apply` runs every Function but ort_zero's
and ORT's own through `with_tensor_outputs(function)`, which exports as the same computation with:

- tensor outputs only: a non-tensor output (None, a number, a string, a tuple of them) leaves the graph and the caller
  gets it back as the constant it was at export, as a trace keeps every Python value. Whether it really is a constant
  is checked on every run in ORT: a value that changes with the data stops the step with the Function's name. Any
  other non-tensor output (a list of tensors, an object) stops the export naming the Function;
- one gradient per input: trailing Nones beyond the inputs dropped (as PyTorch drops them), zeros where the backward
  returns None for a floating-point input ORT differentiates (torch's None means zeros).

A Function whose `apply` was bound before the export (`op = MyFunction.apply` at import) calls torch's `apply`
itself and is exported as ORT exports it. ORT names the PythonOp after the wrapper, `<module>.<Function's qualified
name>.WithTensorOutputs`. A Function's `infer_shape` (ORT's shape-inference callback) is kept; `OUTPUT_SHAPES`
declares it for Functions whose output ORT must know the shape of and that have none (PhiMoE's: ORT's gradient of a
Mul that broadcasts a PythonOp output whose shape it does not know leaves the broadcast dimensions unreduced).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...foreign import ortmodule
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
        "__doc__": f"{name} with tensor outputs only and one gradient per input (ort_zero.ort.export.autograd).",
        "wrapped_by_ort_zero": function,
    }
    infer_shape = getattr(function, "infer_shape", None) or OUTPUT_SHAPES.get(name)
    if infer_shape is not None:
        members["infer_shape"] = staticmethod(infer_shape)
    # a direct subclass of Function: ORT registers no other kind of class for a PythonOp
    return type(f"{function.__name__}WithTensorOutputs", (torch.autograd.Function,), members)


def _exported_as_is(function: type) -> bool:
    """ort_zero's own Functions (bridges, PythonOps, wrappers) and ORT's, and those ORT exports its own way."""
    module = function.__module__ or ""
    return (
        module.split(".")[0] in ("ort_zero", "onnxruntime")
        or "wrapped_by_ort_zero" in vars(function)
        or ortmodule.has_own_function_export(function_name(function))
    )


def _inputs(function: type, args: tuple, kwargs: dict) -> tuple:
    """The Function's inputs as positional arguments (what its forward and backward count)."""
    if not kwargs:
        return args
    forward = inspect.signature(function.forward)
    with_ctx = function.setup_context is torch.autograd.Function.setup_context
    bound = forward.bind(*((None,) if with_ctx else ()), *args, **kwargs)
    bound.apply_defaults()
    if bound.kwargs:
        raise TypeError(f"ort_zero: {function_name(function)} takes keyword-only arguments")
    return bound.args[1:] if with_ctx else bound.args


def applying_with_tensor_outputs(apply: Any) -> classmethod:
    """`Function.apply` while a ZeRO-3 model is exported: every Function but ort_zero's and ORT's own runs as
    `with_tensor_outputs(function)`, and its caller gets its outputs as the Function returns them."""

    def apply_function(cls: type, *args: Any, **kwargs: Any) -> Any:
        if _exported_as_is(cls):
            return apply.__get__(None, cls)(*args, **kwargs)
        layout = OutputLayout(function_name(cls))
        inputs = _inputs(cls, args, kwargs)
        layout.bool_inputs = {
            i for i, arg in enumerate(inputs) if isinstance(arg, torch.Tensor) and arg.dtype == torch.bool
        }
        inputs = [arg.to(torch.uint8) if i in layout.bool_inputs else arg for i, arg in enumerate(inputs)]
        tensors = with_tensor_outputs(cls).apply(*inputs, layout)
        return layout.outputs(tensors if isinstance(tensors, tuple) else (tensors,))

    return classmethod(apply_function)
