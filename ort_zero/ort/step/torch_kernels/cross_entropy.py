"""A language model's loss as torch's kernels inside ORT's graph.

torch's exporter writes `F.cross_entropy` as ONNX's SoftmaxCrossEntropyLoss, which ORT 1.19.2 computes on CPU in 3x
torch's time on a [1024, 32000] batch of logits (0.48 vs 0.16 s, one thread, measured 2026-11-26): at seq 1024 a
second of every step. While a ZeRO-3 model is exported, `F.cross_entropy` on 2-D logits and class indices (what
transformers' causal-LM loss calls) runs as `CrossEntropyInTorch`, a PythonOp whose forward is torch's log-softmax
and NLL loss and whose backward is written out on the log-probabilities it keeps, as ORT's own loss keeps them.
While the model is traced for its export, logits of zeros (the stand-ins', `ort.export.context`) give every counted
row the loss log(classes), without the log-softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ....hooks.export_mode import is_exporting
from .context import wanted_grads
from .devices import faster_in_torch


class CrossEntropyInTorch(torch.autograd.Function):
    """`F.cross_entropy(logits, target, ignore_index=ignore_index, reduction='mean' if mean else 'sum')` for logits
    [N, C] and targets [N]."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, ignore_index: int, mean: bool) -> torch.Tensor:
        wanted_grads(ctx, logits, target, ignore_index, mean)
        if is_exporting() and not logits.any():  # the stand-ins' logits: every counted row's loss is log(classes)
            counted = (target != ignore_index).sum().to(logits.dtype)
            per_row = logits.new_full((), math.log(logits.shape[-1]))
            return per_row * counted / counted if mean else per_row * counted  # a mean over no rows: NaN, as torch's
        log_probs = torch.log_softmax(logits, dim=-1)
        loss = torch.nn.functional.nll_loss(
            log_probs, target, ignore_index=ignore_index, reduction="mean" if mean else "sum"
        )
        keep = ctx.needs_input_grad[0] and not is_exporting()  # the trace's forward has no backward
        ctx.kept = (log_probs, target.clone()) if keep else None  # ORT reuses the target's buffer after the forward
        ctx.ignore_index, ctx.mean = ignore_index, mean
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """softmax - one_hot(target) per counted row, zero for ignored rows, times the loss's gradient (over the
        counted rows for a mean): computed in the kept log-probabilities' own buffer."""
        log_probs, target = ctx.kept
        ctx.kept = None
        counted = target != ctx.ignore_index
        logits_grad = log_probs.exp_()
        rows = torch.arange(target.shape[0], device=target.device)[counted]
        logits_grad[rows, target[counted]] -= 1
        logits_grad.mul_(counted.unsqueeze(-1))
        scale = grad / counted.sum().clamp(min=1) if ctx.mean else grad
        return logits_grad.mul_(scale.to(logits_grad.dtype)), None, None, None

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """A scalar of the logits' type."""
        return [[]], [dtypes[0]]


def cross_entropy_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory for `F.cross_entropy`: `CrossEntropyInTorch` for 2-D floating-point logits, class-index
    targets, no weights, no label smoothing and a mean or sum, on a device where it was measured faster (`devices`);
    `replaced` (ORT's own loss) for the rest."""

    def cross_entropy(
        input: torch.Tensor,
        target: torch.Tensor,
        weight: torch.Tensor | None = None,
        size_average: bool | None = None,
        ignore_index: int = -100,
        reduce: bool | None = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> torch.Tensor:
        ours = (
            input.dim() == 2 and input.is_floating_point() and target.dim() == 1 and target.dtype == torch.int64
            and weight is None and size_average is None and reduce is None and label_smoothing == 0.0
            and reduction in ("mean", "sum") and faster_in_torch(input)
        )  # fmt: skip
        if not ours:
            return replaced(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        return CrossEntropyInTorch.apply(input, target, int(ignore_index), reduction == "mean")

    return cross_entropy
