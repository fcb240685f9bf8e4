"""train_gpt with one planted fault, for the run record's tests (the gradient's and the update's in PyTorch runs; the
activation's in ORT runs too, where it is a PythonOp ORT runs at every step).

PLANT=grad:<block>:<step>:<factor>  the gradient flowing into GPT block <block> scaled by <factor> from optimizer
                                    step <step> on (every rank)
PLANT=act:<block>:<step>:<factor>   GPT block <block>'s output scaled by <factor> in optimizer step <step>'s forward
PLANT=update:<rank>:<step>          rank <rank>'s learning rate 0 at optimizer step <step>: its share not updated
Arguments are train_gpt's.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from ort_zero.examples import train_gpt
from ort_zero.hooks.export_mode import is_exporting

KIND, *FIELDS = os.environ["PLANT"].split(":")
_build_model = train_gpt.build_model
_step = train_gpt.Trainer.step


def with_scaled_gradient(args: Any) -> torch.nn.Module:
    model = _build_model(args)
    block, first, factor = int(FIELDS[0]), int(FIELDS[1]), float(FIELDS[2])
    backwards = [0]  # one backward per optimizer step (no accumulation in these runs)

    def scale(module: torch.nn.Module, grad_output: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        backwards[0] += 1
        return tuple(g * factor for g in grad_output) if backwards[0] > first else None

    model.blocks[block].register_full_backward_pre_hook(scale)
    return model


class PerturbedAt(torch.autograd.Function):
    """`tensor * factor` in the forward of one optimizer step, `tensor` in the others (in ORT: a PythonOp whose
    forward runs at every step; the export's trace is not a step)."""

    forwards = 0

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, step: int, factor: float) -> torch.Tensor:
        if is_exporting():
            return tensor.clone()
        PerturbedAt.forwards += 1
        ctx.factor = factor if PerturbedAt.forwards == step + 1 else 1.0
        return tensor * ctx.factor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad * ctx.factor, None, None


def with_a_perturbed_activation(args: Any) -> torch.nn.Module:
    model = _build_model(args)
    block, step, factor = int(FIELDS[0]), int(FIELDS[1]), float(FIELDS[2])
    model.blocks[block].register_forward_hook(lambda module, inputs, output: PerturbedAt.apply(output, step, factor))
    return model


def step_losing_an_update(self: train_gpt.Trainer, step: int) -> float:
    rank, lost = int(FIELDS[0]), int(FIELDS[1])
    groups = self.engine.optimizer.param_groups
    kept = [group["lr"] for group in groups]
    if step == lost and self.rank == rank:
        for group in groups:
            group["lr"] = 0.0
    try:
        return _step(self, step)
    finally:
        for group, lr in zip(groups, kept, strict=True):
            group["lr"] = lr


if KIND == "grad":
    train_gpt.build_model = with_scaled_gradient
elif KIND == "act":
    train_gpt.build_model = with_a_perturbed_activation
elif KIND == "update":
    train_gpt.Trainer.step = step_losing_an_update
else:
    raise SystemExit(f"planted_faults: unknown PLANT {os.environ['PLANT']!r}")

if __name__ == "__main__":
    sys.exit(train_gpt.main())
