"""Autograd Functions of every shape PyTorch allows, exported as ORT PythonOps (ort_zero/ort/export/autograd.py): a
module calling one, exported through ORTModule (fallback disabled) while the group is applied, trains in ORT with
PyTorch's loss and gradients; exported as ORT exports them, the shapes ORT's PythonOp cannot take stop it. Each test
has its own Function classes: ORT keeps the first Function registered under a name for the whole process."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

import ort_zero  # noqa: F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero import patches
from ort_zero.ort.export.autograd import with_tensor_outputs
from ort_zero.ort.inspection import ort_run_record
from ort_zero.python_op import function_name

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
GROUP = "export_autograd_functions"


class NoneOutputs(torch.autograd.Function):
    """TRL's ChunkedLogProbFunction in small: outputs not asked for are None, a bool output is not differentiable."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, outputs: tuple[str, ...]) -> tuple:
        ctx.save_for_backward(x, weight)
        product = x @ weight
        flags = product > 0
        ctx.mark_non_differentiable(flags)
        return product, (product.exp() if "exp" in outputs else None), None, flags

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, grad_exp: torch.Tensor | None, *_: Any) -> tuple:
        x, weight = ctx.saved_tensors
        return grad @ weight.t(), x.t() @ grad, None


class NoneGradient(torch.autograd.Function):
    """PhiMoE's multiplier in small: x * scale, whose backward gives the scale (differentiable) no gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(scale)
        return x * scale

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (scale,) = ctx.saved_tensors
        return grad * scale, None


class ExtraTrailingNone(torch.autograd.Function):
    """Reformer's reversible Function in small: a gradient more than inputs, None (PyTorch drops it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x * factor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad * ctx.factor, None, None


class TupleOutputs(torch.autograd.Function):
    """Two tensor outputs, both differentiated; written the second way (forward without ctx, setup_context)."""

    @staticmethod
    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sin(), x * 3

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx: Any, grad_sin: torch.Tensor, grad_triple: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad_sin * x.cos() + grad_triple * 3


class TensorAndInt(torch.autograd.Function):
    """A tensor and ints that depend on shapes only: the rank (a constant of the graph) and a size (which a trace
    records as a tensor, as it records every size)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        return x.tanh(), x.dim(), x.shape[-1]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: None) -> torch.Tensor:
        return grad  # straight-through


class Calls(torch.nn.Module):
    """`call(self, h)` between Linear layers, so that each gradient must reach trained weights."""

    def __init__(self, call: Any) -> None:
        super().__init__()
        self.call = call
        self.first, self.second, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.call(self, self.first(x).relu(), self.second(x))).square().mean()


def none_outputs(self: Calls, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    product, exp, nothing, flags = NoneOutputs.apply(h, self.second.weight, ("log",))
    assert exp is None and nothing is None, "the caller gets the constants back"
    return product * flags + g


def none_gradient(self: Calls, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return NoneGradient.apply(h, g.softmax(-1)) + g


def extra_trailing_none(self: Calls, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return ExtraTrailingNone.apply(h, 2.0) + g


def tuple_outputs(self: Calls, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    sin, triple = TupleOutputs.apply(h)
    return sin * g + triple


def tensor_and_int(self: Calls, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    squashed, rank, width = TensorAndInt.apply(h)
    assert isinstance(rank, int), "the caller gets the int back"
    return squashed * width + g * rank


CASES = {
    NoneOutputs: none_outputs,
    NoneGradient: none_gradient,
    ExtraTrailingNone: extra_trailing_none,
    TupleOutputs: tuple_outputs,
    TensorAndInt: tensor_and_int,
}


def _step(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = model(x)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return loss.detach(), grads


@pytest.mark.parametrize("function", list(CASES), ids=lambda function: function.__name__)
def test_a_function_trains_in_ort_as_in_pytorch(function: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two steps on other batches: the PythonOp is the wrapper, and losses and gradients are PyTorch's."""
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    torch.manual_seed(0)
    reference, model = Calls(CASES[function]), Calls(CASES[function])
    model.load_state_dict(reference.state_dict())
    in_ort = ortmodule.ORTModule(model)
    for step in range(2):
        x = torch.randn(4, 8)
        expected_loss, expected_grads = _step(reference, x)
        if step == 0:
            with patches.applied(GROUP):  # ORTModule exports at the first forward
                loss, grads = _step(in_ort, x)
        else:
            loss, grads = _step(in_ort, x)
        torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
        for grad, expected in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)
    record = ort_run_record(in_ort)["training"]
    assert record["session"], "no ORT session: the model did not run in ORT"
    assert function_name(with_tensor_outputs(function)) in str(record), record


class NoneOutputsAsIs(NoneOutputs):
    """NoneOutputs under another name, exported as ORT exports it."""


class NoneGradientAsIs(NoneGradient):
    """NoneGradient under another name, exported as ORT exports it."""


def test_without_the_wrapper_ort_cannot_train_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shapes the wrapper is for stop ORT's own PythonOp: None outputs at export, None gradients in the
    backward."""
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")

    def none_outputs_as_is(self: Calls, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return NoneOutputsAsIs.apply(h, self.second.weight, ("log",))[0] + g

    def none_gradient_as_is(self: Calls, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return NoneGradientAsIs.apply(h, g.softmax(-1)) + g

    with pytest.raises(Exception):  # noqa: B017, PT011 - ORT's exporter or runner, in its own words
        ortmodule.ORTModule(Calls(none_outputs_as_is))(torch.randn(4, 8)).backward()
    with pytest.raises(Exception):  # noqa: B017, PT011
        ortmodule.ORTModule(Calls(none_gradient_as_is))(torch.randn(4, 8)).backward()


class DataDependentInt(torch.autograd.Function):
    """A tensor and an int computed from the values: no constant."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x.clone(), int((x > 0).sum())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: None) -> torch.Tensor:
        return grad


def test_a_non_tensor_output_that_changes_with_the_data_stops_the_step_naming_the_function(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")

    def counted(self: Calls, h: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return DataDependentInt.apply(h - 0.5)[0] + g

    in_ort = ortmodule.ORTModule(Calls(counted))
    with patches.applied(GROUP):
        in_ort(torch.ones(4, 8))
    with pytest.raises(Exception):  # noqa: B017, PT011 - ORT reports a PythonOp's exception as "Get null result"
        in_ort(-torch.ones(4, 8))
    assert "DataDependentInt returned" in capfd.readouterr().err  # ORT prints the Function's exception


class ListOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, list]:
        return x.clone(), [x.clone()]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: None) -> torch.Tensor:
        return grad


def test_an_output_neither_tensor_nor_constant_stops_the_export_naming_the_function() -> None:
    with patches.applied(GROUP), pytest.raises(TypeError, match="ListOutput returns a list as output 1"):
        ListOutput.apply(torch.ones(2))


def test_a_backward_with_a_gradient_beyond_the_inputs_is_refused() -> None:
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return grad, grad

    with patches.applied(GROUP):
        out = Wrong.apply(torch.ones(2, requires_grad=True))
    with pytest.raises(RuntimeError, match="Wrong's backward returned 2 gradients for 1 inputs"):
        out.sum().backward()


def test_outside_an_export_functions_are_pytorch_s() -> None:
    assert not patches.is_applied("torch.autograd_function_with_tensor_outputs_in_export")
    assert TensorAndInt.apply(torch.ones(2))[2] == 2
