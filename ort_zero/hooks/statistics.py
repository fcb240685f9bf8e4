"""Per-step statistics of module outputs and chosen activations, to find where two training runs start to differ.

Convergence investigation compares a PyTorch run with an ORT run of the same model, seed and data. Statistics are
collected on the PyTorch path only: under ORTModule a module's forward runs inside ONNX Runtime, so module hooks
fire only while the forward is traced for export, and nothing is recorded then (a recording would otherwise
become part of the exported graph). In an ORT run, subscribe the statistics to a module whose forward stays in
PyTorch around the ORTModule (the DeepSpeed engine, or a wrapper that calls the ORTModule and computes the loss):
its outputs, and what its forward passes to `inspect_activation` outside the ORTModule, get the same names as in
the PyTorch run (the outermost module is `(root)` in both), so `ort-zero compare` can line them up.

Dump format: one JSON object per line in `<output_dir>/rank_<r>/step_<s>.jsonl`, in recording order (module
outputs as each module's forward returns, outermost last). Keys: `index`, `name` (`<module name>/output_<i>`,
`(root)` for the outermost module, or the name given to `inspect_activation`; a repeated name gets `#2`, `#3`...),
`kind` (`module_output` or `activation`), `shape`, `dtype`, `numel`, and for floating-point tensors `mean`, `std`
(population, correction=0), `min`, `max`, `abs_mean`, `nan_count`, `inf_count`; other tensors get `min` and `max`
only. As in torch, a NaN makes mean, std, min and max NaN; non-finite values are written as JSON's NaN/Infinity.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from .export_mode import is_exporting
from .subscriber import RunContext, SubscriberBase

ROOT_NAME = "(root)"
MODULE_OUTPUT = "module_output"
ACTIVATION = "activation"

_current: StatisticsSubscriber | None = None


def rank_dir(output_dir: str | Path, rank: int) -> Path:
    return Path(output_dir) / f"rank_{rank}"


def step_file(output_dir: str | Path, rank: int, step: int) -> Path:
    return rank_dir(output_dir, rank) / f"step_{step}.jsonl"


@torch.no_grad()
def tensor_statistics(
    tensor: torch.Tensor, bucket_size: int | None = None, compute_on_cpu: bool = False
) -> dict[str, Any]:
    """Statistics of `tensor`, computed in float64 over chunks of at most `bucket_size` elements.

    Chunks keep the float64 working copy bounded for large activations. They combine exactly: sums and counts add,
    min/max reduce, and the squared deviations add once corrected for each chunk's distance to the overall mean.
    """
    data = tensor.detach()
    stats: dict[str, Any] = {"shape": list(data.shape), "dtype": str(data.dtype).removeprefix("torch.")}
    stats["numel"] = data.numel()
    if data.numel() == 0 or data.is_complex():
        return stats
    flat = data.reshape(-1)
    size = bucket_size or flat.numel()
    chunks = (flat[start : start + size] for start in range(0, flat.numel(), size))
    if compute_on_cpu:
        chunks = (chunk.cpu() for chunk in chunks)
    if not data.is_floating_point():
        extremes = torch.stack([torch.stack([chunk.min(), chunk.max()]) for chunk in chunks])
        stats["min"], stats["max"] = extremes[:, 0].min().item(), extremes[:, 1].max().item()
        return stats
    counts, sums, squares, abs_sums, mins, maxs, nans, infs = ([] for _ in range(8))
    for chunk in chunks:
        x = chunk.to(torch.float64)
        counts.append(x.numel())
        sums.append(x.sum())
        squares.append((x - sums[-1] / x.numel()).square().sum())
        abs_sums.append(x.abs().sum())
        mins.append(x.min())
        maxs.append(x.max())
        nans.append(torch.isnan(x).sum())
        infs.append(torch.isinf(x).sum())
    n = torch.tensor(counts, dtype=torch.float64, device=sums[0].device)
    sums_t = torch.stack(sums)
    mean = sums_t.sum() / n.sum()
    spread = torch.stack(squares).sum() + (n * (sums_t / n - mean).square()).sum()
    stats["mean"] = mean.item()
    stats["std"] = (spread / n.sum()).sqrt().item()
    stats["min"] = torch.stack(mins).min().item()
    stats["max"] = torch.stack(maxs).max().item()
    stats["abs_mean"] = (torch.stack(abs_sums).sum() / n.sum()).item()
    stats["nan_count"] = int(torch.stack(nans).sum().item())
    stats["inf_count"] = int(torch.stack(infs).sum().item())
    return stats


class StatisticsSubscriber(SubscriberBase):
    """Writes statistics of every module output, each step of its window, to one JSONL file per rank and step.

    A step is one outermost forward: records and `inspect_activation` calls count from the outermost module's
    pre-forward to its post-forward (so record a loss by computing it inside that forward, or in a wrapper's).
    Module names come from the outermost module's `named_modules()`. Records are appended as they are computed:
    a forward that raises keeps what was recorded before the error (and its step stays open until the next
    forward), and the subscriber holds no open file (ORTModule deep-copies modules before export).
    """

    def __init__(
        self,
        output_dir: str | Path,
        start_step: int | None = None,
        end_step: int | None = None,
        *,
        compute_on_cpu: bool = False,
        bucket_size: int | None = None,
    ) -> None:
        super().__init__(start_step, end_step)
        if bucket_size is not None and bucket_size < 1:
            raise ValueError(f"bucket_size must be a positive number of elements, got {bucket_size}")
        self.output_dir = Path(output_dir)
        self.compute_on_cpu = compute_on_cpu
        self.bucket_size = bucket_size
        self._names: dict[int, str] = {}
        self._path: Path | None = None  # the open step's dump; None between forwards
        self._previous: StatisticsSubscriber | None = None
        self._seen: Counter[str] = Counter()
        self._count = 0

    def pre_forward_outermost_module(
        self, run_context: RunContext, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[tuple, dict[str, Any]]:
        if not is_exporting():
            self._begin_step(run_context.global_step, module)
        return args, kwargs

    def post_forward_tensor(
        self, run_context: RunContext, module: torch.nn.Module, index: int, tensor: torch.Tensor
    ) -> torch.Tensor:
        name = self._names.get(id(module), type(module).__name__)
        self.record(f"{name}/output_{index}", tensor, MODULE_OUTPUT)
        return tensor

    def post_forward_outermost_module(
        self, run_context: RunContext, module: torch.nn.Module, args: tuple, outputs: Any
    ) -> Any:
        global _current
        if not is_exporting() and self._path is not None:
            self._path = None
            if _current is self:
                _current = self._previous
        return outputs

    def record(self, name: str, tensor: torch.Tensor, kind: str = ACTIVATION) -> None:
        """Append `tensor`'s statistics to the open step's dump; nothing between forwards or while exporting."""
        if self._path is None or is_exporting():
            return
        self._seen[name] += 1
        if self._seen[name] > 1:
            name = f"{name}#{self._seen[name]}"
        entry = {"index": self._count, "name": name, "kind": kind}
        entry.update(tensor_statistics(tensor, self.bucket_size, self.compute_on_cpu))
        self._count += 1
        with self._path.open("a", encoding="utf-8") as stream:
            stream.write(json.dumps(entry) + "\n")

    def _begin_step(self, step: int, root: torch.nn.Module) -> None:
        global _current
        if _current is not self:
            self._previous = _current
        _current = self
        self._seen.clear()
        self._count = 0
        self._names = {id(module): name for name, module in root.named_modules()}
        self._names[id(root)] = ROOT_NAME
        self._path = step_file(self.output_dir, _rank(), step)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._path.write_text("", encoding="utf-8")  # a rerun into the same folder replaces the step


def inspect_activation(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Record `tensor` under `name` in the active StatisticsSubscriber's current step; returns `tensor` unchanged.

    Call it inside the forward of a subscribed model. It does nothing when no subscriber is recording a step
    (outside a forward or outside the subscriber's window) and while exporting, so it never adds graph nodes.
    """
    if _current is not None:
        _current.record(name, tensor)
    return tensor


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0
