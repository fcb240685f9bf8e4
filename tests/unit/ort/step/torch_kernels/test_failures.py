"""A torch kernel's failure inside ORT's graph is the step's one error (ort_zero/ort/step/torch_kernels/failures.py):
the kernel's message, naming the running layer and the way out, replaces ORT's 'Get null result' for the node."""

from __future__ import annotations

import pytest
import torch

from ort_zero.foreign import deepspeed as ds_internals
from ort_zero.ort.step.torch_kernels.failures import kernel_failure, raising_kernel_failure


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.Identity()


def test_the_kernel_error_names_the_running_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(Layer())
    monkeypatch.setattr(ds_internals, "forward_module_stack", lambda: [model, model[0], model[0].attn])
    failure = kernel_failure("scaled_dot_product_attention", "a mask", RuntimeError("bad mask"), "pick eager")
    assert str(failure) == (
        "ort_zero: scaled_dot_product_attention in '0.attn' (Identity), run by torch inside ONNX Runtime's graph, "
        "failed on a mask: bad mask -- pick eager"
    )


def test_the_step_raises_the_kernels_error_instead_of_orts() -> None:
    def run_forward(agent: object) -> None:
        raise kernel_failure("the experts", "tokens", RuntimeError("no kernel"), "pick eager") from None

    def ort_run(agent: object) -> None:
        try:
            run_forward(agent)
        except RuntimeError:
            raise RuntimeError("Non-zero status code returned while running PythonOp node: Get null result") from None

    with pytest.raises(RuntimeError, match="ort_zero: the experts in the model") as raised:
        raising_kernel_failure(ort_run)(object())
    assert "Get null result" in str(raised.value.__cause__)


def test_other_errors_pass_unchanged() -> None:
    def ort_run(agent: object) -> None:
        raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="^something else$"):
        raising_kernel_failure(ort_run)(object())
