"""Per-step statistics of module outputs and chosen activations, to find where two training runs start to differ.

Convergence investigation compares a PyTorch run with an ORT run of the same model, seed and data. Subscribe a
`StatisticsSubscriber` to the model (before wrapping it in ORTModule) in both runs. In PyTorch every module output
is recorded when its forward returns. Under ORTModule the hooks run once, while the model is exported: they put a
recorder op (an autograd Function that ORT runs as a PythonOp) on each module output and on each tensor passed to
`inspect_activation`, so ONNX Runtime hands every such tensor back to be recorded at every step. Both runs write
the same names, and `ort-zero compare` lines them up. ORT may run independent branches in another order than
PyTorch: records are matched by name, and `index` is the order of recording.

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

from ..python_op import KeyedRegistry, alias_maps, same_shapes
from .export_mode import is_exporting
from .nested import flatten
from .passthrough import input_grads, keyed_alias_input, keyed_backward, passed_through
from .subscriber import RunContext, SubscriberBase

ROOT_NAME = "(root)"
MODULE_OUTPUT = "module_output"
ACTIVATION = "activation"

_current: StatisticsSubscriber | None = None  # whose forward is running (traced or not), for inspect_activation
SUBSCRIBERS: KeyedRegistry[StatisticsSubscriber] = KeyedRegistry("statistics subscriber")


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

    A step is one outermost forward; the subscriber counts them itself (`step`), because under ORTModule the module
    hooks run once, at export, and only the recorder PythonOps they leave in the graph run at every step. So the
    window is applied when a record is made, not when hooks run. Module names come from the outermost module's
    `named_modules()`. Records are appended as they are computed; a forward that raises keeps what it recorded and
    the next forward continues the same step. The subscriber holds no open file (ORTModule deep-copies modules).
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
        super().__init__()  # always active: the window is checked per record, see the class docstring
        if bucket_size is not None and bucket_size < 1:
            raise ValueError(f"bucket_size must be a positive number of elements, got {bucket_size}")
        self.output_dir = Path(output_dir)
        self.window = (start_step, end_step)
        self.compute_on_cpu = compute_on_cpu
        self.bucket_size = bucket_size
        self.step = 0
        self.key = SUBSCRIBERS.add(self)
        self._labels: dict[tuple[str, str], int] = {}  # (name, kind) -> label, the integer a recorder op carries
        self._names: dict[int, str] = {}
        self._previous: StatisticsSubscriber | None = None
        self._open_step: int | None = None  # the step whose dump has been started
        self._seen: Counter[str] = Counter()
        self._count = 0

    def pre_forward_outermost_module(
        self, run_context: RunContext, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[tuple, dict[str, Any]]:
        global _current
        self._previous, _current = _current, self
        self._names = {id(m): name for name, m in module.named_modules()}
        self._names[id(module)] = ROOT_NAME
        return args, kwargs

    def post_forward_tensor(
        self, run_context: RunContext, module: torch.nn.Module, index: int, tensor: torch.Tensor
    ) -> torch.Tensor:
        name = self._names.get(id(module), type(module).__name__)
        return self.observe(f"{name}/output_{index}", tensor, MODULE_OUTPUT)

    def post_forward_outermost_module(
        self, run_context: RunContext, module: torch.nn.Module, args: tuple, outputs: Any
    ) -> Any:
        global _current
        if _current is self:
            _current = self._previous
        if not is_exporting():
            self.finish_step()
        elif torch.onnx.is_in_onnx_export():
            # Every output passes through the op, so it runs after every recorder that feeds an output.
            flat = flatten(outputs)
            if flat.tensors:
                outputs = flat.rebuild(list(EndStep.apply(self.key, *flat.tensors)))
        return outputs

    def observe(self, name: str, tensor: torch.Tensor, kind: str) -> torch.Tensor:
        """Record `tensor` now (PyTorch), or return it through a recorder op that records it at run time (ONNX)."""
        if not is_exporting():
            self.record(name, tensor, kind)
            return tensor
        if torch.onnx.is_in_onnx_export():
            return RecordStatistics.apply(self.key, self._labels.setdefault((name, kind), len(self._labels)), tensor)
        return tensor

    def record(self, name: str, tensor: torch.Tensor, kind: str = ACTIVATION) -> None:
        """Append `tensor`'s statistics to the current step's dump, if the step is in the window."""
        start, end = self.window
        if (start is not None and self.step < start) or (end is not None and self.step >= end):
            return
        if self._open_step != self.step:
            self._begin_dump()
        self._seen[name] += 1
        if self._seen[name] > 1:
            name = f"{name}#{self._seen[name]}"
        entry = {"index": self._count, "name": name, "kind": kind}
        entry.update(tensor_statistics(tensor, self.bucket_size, self.compute_on_cpu))
        self._count += 1
        with step_file(self.output_dir, _rank(), self.step).open("a", encoding="utf-8") as stream:
            stream.write(json.dumps(entry) + "\n")

    def record_label(self, label: int, tensor: torch.Tensor) -> None:
        name, kind = next(key for key, value in self._labels.items() if value == label)
        self.record(name, tensor, kind)

    def finish_step(self) -> None:
        self.step += 1

    def _begin_dump(self) -> None:
        self._open_step = self.step
        self._seen.clear()
        self._count = 0
        path = step_file(self.output_dir, _rank(), self.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("", encoding="utf-8")  # a rerun into the same folder replaces the step


class RecordStatistics(torch.autograd.Function):
    """Identity that records its tensor's statistics; in ORT a PythonOp carrying the subscriber key and a label."""

    @staticmethod
    def forward(ctx: Any, key: int, label: int, tensor: torch.Tensor) -> torch.Tensor:
        if not is_exporting():
            SUBSCRIBERS[key].record_label(label, tensor)
        return passed_through(ctx, RecordStatistics, (key, label), (tensor,))[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[Any, ...]:
        return (None, None, *input_grads(ctx, (grad,)))

    infer_shape = staticmethod(same_shapes)

    @staticmethod
    def alias_input(node_proto: bytes) -> tuple[list, list]:
        return alias_maps(node_proto, non_tensor_inputs=2)


class EndStep(torch.autograd.Function):
    """Identity on the outermost module's outputs that closes the subscriber's step at run time."""

    @staticmethod
    def forward(ctx: Any, key: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not is_exporting():
            SUBSCRIBERS[key].finish_step()
        return passed_through(ctx, EndStep, (key,), tensors)

    backward = staticmethod(keyed_backward)
    infer_shape = staticmethod(same_shapes)
    alias_input = staticmethod(keyed_alias_input)


def inspect_activation(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Record `tensor` under `name` in the current step of the subscriber of the model whose forward is running.

    Use the returned tensor: under ORTModule it is the output of the recorder op, which ORT would prune otherwise.
    Outside a subscribed forward it returns `tensor` itself and records nothing.
    """
    if _current is None:
        return tensor
    return _current.observe(name, tensor, ACTIVATION)


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0
