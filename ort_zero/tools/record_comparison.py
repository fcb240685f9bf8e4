"""Where two run records (`integrations.run_record`) part: the first step, and in it the forward (a module's output,
or the loss), the backward (a gradient, in backward order) or the optimizer step (a parameter after it), and the layer.

Tensors are compared by their statistics: the mean, standard deviation and mean magnitude of the two, each
difference relative to the larger of the two tensors' scales (mean magnitude or deviation), so a near-zero mean does
not magnify rounding; the extremes are left out (one element's Adam step, lr-sized where its gradient is near zero,
moves a maximum without saying anything about the tensor). The tolerance follows the two runs' precisions
(`TOLERANCE`, the looser of the two), unless one is given.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..integrations.record_files import RECORD, STEPS

TOLERANCE = {"fp32": 1e-3, "fp16": 1e-2, "bf16": 5e-2}
"""Relative difference of the statistics a run in each precision explains. Measured (tests/distributed/
test_run_record.py, 4-6 steps): fp32 runs that sum in another order (1 rank with accumulation, ORT) below 1e-6;
fp32 against bf16, 0.4% in the loss and 0.7-1.2% in the gradients. Differences grow over a run's steps, hence the
margins."""
COMPARED = ("mean", "std", "abs_mean")
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer step"


class RecordError(ValueError):
    """Two records that cannot be compared; the message says why."""


@dataclass(frozen=True)
class Record:
    path: Path
    run: dict[str, Any]
    steps: dict[int, dict[str, Any]]


@dataclass(frozen=True)
class Parting:
    step: int
    part: str  # FORWARD, BACKWARD or OPTIMIZER
    tensor: str  # "loss", or a parameter's name
    layer: str
    difference: float


@dataclass
class Comparison:
    a: Record
    b: Record
    tolerance: float
    given: bool  # the tolerance was asked for, not derived from the precisions
    steps: list[int]
    parting: Parting | None
    by_layer: dict[str, list[float]] = field(default_factory=dict)  # per step, the largest gradient difference
    activations: bool = False  # whether the forward was compared module by module


def load(path: Path) -> Record:
    if not (path / RECORD).is_file() or not (path / STEPS).is_file():
        raise RecordError(f"{path} holds no run record ({RECORD} and {STEPS}: record the run with run_record)")
    run = json.loads((path / RECORD).read_text())
    steps = {}
    for line in (path / STEPS).read_text().splitlines():
        entry = json.loads(line)
        steps[entry["step"]] = entry
    return Record(path, run, steps)


def comparable(a: Record, b: Record) -> list[int]:
    """The steps both recorded; RecordError where the runs trained other models or other data."""
    names_a, names_b = a.run["parameters"], b.run["parameters"]
    if names_a != names_b:
        x, y = next((x, y) for x, y in zip([*names_a, None], [*names_b, None], strict=False) if x != y)
        raise RecordError(f"the runs trained other models: {_named(x)} in {a.path}, {_named(y)} in {b.path}")
    if a.run["train_batch_size"] != b.run["train_batch_size"]:
        raise RecordError(
            f"the runs trained on other data: global batches of {a.run['train_batch_size']} in {a.path} and "
            f"{b.run['train_batch_size']} in {b.path} (make up world sizes with gradient accumulation)"
        )
    steps = sorted(set(a.steps) & set(b.steps))
    if not steps:
        raise RecordError(f"no step recorded in both: {sorted(a.steps)} in {a.path}, {sorted(b.steps)} in {b.path}")
    for step in steps:
        x, y = a.steps[step].get("samples"), b.steps[step].get("samples")
        if x is not None and y is not None and x != y:
            shared = len(set(x) & set(y))
            raise RecordError(
                f"the runs trained on other data: step {step}'s samples differ ({shared} of {len(x)} in both; "
                "another seed, dataset or shuffling)"
            )
    return steps


def _named(parameter: list | None) -> str:
    return "no parameter" if parameter is None else f"{parameter[0]} {tuple(parameter[1])}"


def tolerance_for(a: Record, b: Record) -> float:
    return max(TOLERANCE[a.run["precision"]], TOLERANCE[b.run["precision"]])


def layer_of(name: str) -> str:
    """A parameter's layer: its name up to the first index (`blocks.1.attn.qkv.weight` -> `blocks.1`), else its
    module."""
    match = re.match(r"(.*?\.\d+)(\.|$)", name)
    return match.group(1) if match else name.rpartition(".")[0] or name


def difference(x: dict[str, Any] | None, y: dict[str, Any] | None) -> float:
    """The largest relative difference of two tensors' statistics (inf where one has none, or a NaN appears)."""
    if x is None or y is None:
        return 0.0 if x is y else math.inf
    scale = max(x["abs_mean"], x["std"], y["abs_mean"], y["std"], 1e-30)
    worst = max(abs(x[key] - y[key]) / scale for key in COMPARED)
    return math.inf if math.isnan(worst) else worst


def compare(a: Record, b: Record, tolerance: float | None = None) -> Comparison:
    steps = comparable(a, b)
    given = tolerance is not None
    comparison = Comparison(a, b, tolerance if given else tolerance_for(a, b), given, steps, None)
    comparison.activations = same_micro_batches(a, b)
    names = [name for name, _ in a.run["parameters"]]
    for name in names:
        comparison.by_layer.setdefault(layer_of(name), [])
    for step in steps:
        x, y = a.steps[step], b.steps[step]
        grads = {name: difference(x["grads"][name], y["grads"][name]) for name in names}
        for layer, series in comparison.by_layer.items():
            series.append(max(d for name, d in grads.items() if layer_of(name) == layer))
        if comparison.parting is None:
            forward = _first_activation(step, x, y, comparison.tolerance) if comparison.activations else None
            comparison.parting = forward or _first_parting(step, x, y, grads, names, comparison.tolerance)
    return comparison


def same_micro_batches(a: Record, b: Record) -> bool:
    """Whether rank 0's first micro-batch of a step is the same in both runs, so their module outputs compare: the
    same ranks and accumulation, both recorded (a PyTorch run; ORT runs its graph, not the modules)."""
    keys = ("world_size", "gradient_accumulation_steps")
    recorded = all(r.steps[min(r.steps)].get("activations") for r in (a, b))
    return recorded and all(a.run[key] == b.run[key] for key in keys)


def _first_activation(step: int, x: dict[str, Any], y: dict[str, Any], tolerance: float) -> Parting | None:
    """The first module output, in the forward order of run A, that differs beyond `tolerance`."""
    for name, stats in x["activations"].items():
        if name in y["activations"]:
            gap = difference(stats, y["activations"][name])
            if not gap <= tolerance:
                return Parting(step, FORWARD, name, layer_of(name.rpartition("/")[0]), gap)
    return None


def _first_parting(
    step: int, x: dict[str, Any], y: dict[str, Any], grads: dict[str, float], names: list[str], tolerance: float
) -> Parting | None:
    loss = abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), abs(y["loss"]), 1e-30)
    if not loss <= tolerance:
        return Parting(step, FORWARD, "loss", "(the loss)", loss)
    for name in reversed(names):  # the backward computes the last layer's gradients first
        if not grads[name] <= tolerance:
            return Parting(step, BACKWARD, name, layer_of(name), grads[name])
    for name in names:
        after = difference(x["params"][name], y["params"][name])
        if not after <= tolerance:
            return Parting(step, OPTIMIZER, name, layer_of(name), after)
    return None
