"""Two run records: the first step and part (forward, backward, optimizer step) and layer where they part, the
tolerance from the precisions, and refusals of runs that cannot be compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ort_zero.integrations.record_files import RECORD, STEPS
from ort_zero.tools import record_comparison as rc

NAMES = ["embed.weight", "blocks.0.mlp.weight", "blocks.1.mlp.weight", "head.weight"]
MODULES = ["embed/output_0", "blocks.0/output_0", "blocks.1/output_0", "head/output_0"]


def stats(scale: float) -> dict[str, float]:
    return {"mean": 0.1 * scale, "std": scale, "abs_mean": 0.8 * scale, "min": -3 * scale, "max": 3 * scale}


def write(path: Path, *, precision: str = "fp32", steps: int = 4, names: list[str] = NAMES, batch: int = 8,
          world_size: int = 2, change: dict[tuple[int, str, str], float] | None = None) -> rc.Record:  # fmt: skip
    """A record whose every tensor has the same statistics, but for `change`: (step, "activations"/"grads"/
    "params"/"loss", name) -> factor."""
    change = change or {}
    path.mkdir(parents=True)
    run = {"parameters": [[n, [4, 4]] for n in names], "zero_stage": 3, "world_size": world_size, "backend": "pytorch",
           "gradient_accumulation_steps": 1, "train_batch_size": batch, "precision": precision}  # fmt: skip
    (path / RECORD).write_text(json.dumps(run))
    lines = []
    for step in range(steps):
        entry = {"step": step, "loss": 2.0 * change.get((step, "loss", ""), 1.0), "grad_norm": 1.0}
        other = (step, "samples", "") in change  # another seed's samples
        entry["samples"] = [f"{'other' if other else step}-{i}" for i in range(batch)]
        for kind, keys in (("activations", MODULES), ("grads", names), ("params", names)):
            entry[kind] = {n: stats(change.get((step, kind, n), 1.0)) for n in keys}
        lines.append(json.dumps(entry))
    (path / STEPS).write_text("\n".join(lines) + "\n")
    return rc.load(path)


def test_equal_runs_agree(tmp_path: Path) -> None:
    comparison = rc.compare(write(tmp_path / "a"), write(tmp_path / "b"))
    assert comparison.parting is None and comparison.steps == [0, 1, 2, 3]


def test_a_gradient_scaled_from_one_step_is_found_there_in_the_backward(tmp_path: Path) -> None:
    """Layer 1's gradient scaled from step 2 changes every earlier layer's too: the backward meets layer 1 first."""
    later = {(s, "grads", n): 1.5 for s in (2, 3) for n in NAMES[:3]}
    comparison = rc.compare(write(tmp_path / "a"), write(tmp_path / "b", change=later))
    assert comparison.parting == rc.Parting(2, rc.BACKWARD, "blocks.1.mlp.weight", "blocks.1", pytest.approx(1 / 3))


def test_an_update_lost_is_found_in_the_optimizer_step(tmp_path: Path) -> None:
    comparison = rc.compare(write(tmp_path / "a"), write(tmp_path / "b", change={(1, "params", "head.weight"): 0.9}))
    assert (comparison.parting.step, comparison.parting.part, comparison.parting.layer) == (1, rc.OPTIMIZER, "head")


def test_a_loss_that_differs_is_the_forward(tmp_path: Path) -> None:
    comparison = rc.compare(write(tmp_path / "a"), write(tmp_path / "b", change={(3, "loss", ""): 1.01}))
    assert (comparison.parting.step, comparison.parting.part) == (3, rc.FORWARD)


def test_the_tolerance_is_the_looser_precisions_unless_given(tmp_path: Path) -> None:
    """A 2% difference parts two fp32 runs, not an fp32 and a bf16 run, unless a tolerance is given."""
    change = {(0, "grads", "head.weight"): 1.02}
    fp32, bf16 = write(tmp_path / "a"), write(tmp_path / "b", precision="bf16", change=change)
    assert rc.compare(fp32, write(tmp_path / "c", change=change)).parting is not None
    assert rc.compare(fp32, bf16).tolerance == rc.TOLERANCE["bf16"]
    assert rc.compare(fp32, bf16).parting is None
    assert rc.compare(fp32, bf16, tolerance=1e-3).parting.tensor == "head.weight"


def test_statistics_near_zero_mean_are_measured_against_the_tensors_scale() -> None:
    a = {"mean": 1e-9, "std": 1.0, "abs_mean": 0.8}
    assert rc.difference(a, {**a, "mean": 2e-9}) < 1e-8


@pytest.mark.parametrize(
    ("other", "reason"),
    [
        ({"names": [*NAMES[:3], "lm_head.weight"]}, "other models: head.weight"),
        ({"batch": 16}, "other data: global batches of 8"),
        ({"change": {(2, "samples", ""): 1.0}}, "other data: step 2's samples differ \\(0 of 8 in both"),
    ],
)
def test_runs_that_cannot_be_compared_are_refused_saying_why(tmp_path: Path, other: dict, reason: str) -> None:
    with pytest.raises(rc.RecordError, match=reason):
        rc.compare(write(tmp_path / "a"), write(tmp_path / "b", **other))


def test_a_folder_without_a_record_is_refused(tmp_path: Path) -> None:
    with pytest.raises(rc.RecordError, match="holds no run record"):
        rc.load(tmp_path)


@pytest.mark.parametrize(("name", "layer"), [("blocks.1.attn.qkv.weight", "blocks.1"), ("head.weight", "head")])
def test_a_parameters_layer(name: str, layer: str) -> None:
    assert rc.layer_of(name) == layer


def test_an_activation_perturbed_in_one_layer_is_found_in_its_forward(tmp_path: Path) -> None:
    """Everything after blocks.1 in the forward, and every gradient, follows the perturbation: the forward names it."""
    later = {(2, "activations", m): 1.01 for m in MODULES[2:]} | {(2, "grads", n): 1.5 for n in NAMES}
    comparison = rc.compare(write(tmp_path / "a"), write(tmp_path / "b", change=later))
    assert (comparison.parting.step, comparison.parting.part, comparison.parting.layer) == (2, rc.FORWARD, "blocks.1")


def test_module_outputs_of_other_micro_batches_are_not_compared(tmp_path: Path) -> None:
    """1 rank and 2 ranks: rank 0's first micro-batch need not be the same; the gradients still are compared."""
    later = {(2, "activations", "blocks.1/output_0"): 1.5}
    comparison = rc.compare(write(tmp_path / "a"), write(tmp_path / "b", world_size=1, change=later))
    assert not comparison.activations and comparison.parting is None
