"""Loading statistics dumps and finding where two runs first differ."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ort_zero.hooks import SubscriberManager
from ort_zero.hooks.statistics import StatisticsSubscriber, inspect_activation, step_file
from ort_zero.tools.activation_summary import (
    DumpError,
    compare_runs,
    format_markdown,
    format_text,
    load_run,
    values_match,
)

Steps = list[list[tuple[str, torch.Tensor]]]


class Emit(torch.nn.Module):
    """Each forward inspects the tensors given for that step, in order: dumps with chosen contents."""

    def __init__(self, steps: Steps) -> None:
        super().__init__()
        self.steps = steps

    def forward(self, step: int) -> None:
        for name, tensor in self.steps[step]:
            inspect_activation(name, tensor)


def dump(output_dir: Path, steps: Steps) -> Path:
    model = Emit(steps)
    SubscriberManager().subscribe(model, [StatisticsSubscriber(output_dir)])
    for step in range(len(steps)):
        model(step)
    return output_dir


def base_steps() -> Steps:
    torch.manual_seed(0)
    return [[(name, torch.randn(4, 5)) for name in ("a", "b", "c")] for _ in range(3)]


def replaced(steps: Steps, step: int, name: str, tensor: torch.Tensor) -> Steps:
    return [[(n, tensor if (s, n) == (step, name) else t) for n, t in tensors] for s, tensors in enumerate(steps)]


def test_load_run_reads_steps_in_order(tmp_path: Path) -> None:
    steps = base_steps()
    run = load_run(dump(tmp_path, steps))
    assert run.rank == 0 and list(run.steps) == [0, 1, 2]
    activations = run.steps[1]
    assert [a.name for a in activations] == ["a", "b", "c"] and [a.index for a in activations] == [0, 1, 2]
    assert activations[1].kind == "activation" and activations[1].stats["shape"] == [4, 5]
    assert activations[1].stats["mean"] == pytest.approx(steps[1][1][1].double().mean().item(), rel=1e-12)


def test_identical_runs_are_within_tolerance(tmp_path: Path) -> None:
    steps = base_steps()
    comparison = compare_runs(load_run(dump(tmp_path / "a", steps)), load_run(dump(tmp_path / "b", steps)))
    assert comparison.within_tolerance and comparison.first_difference is None
    assert comparison.compared == 9 and [s.max_abs_diff for s in comparison.steps] == [0.0, 0.0, 0.0]


def test_first_difference_is_the_earliest_step_then_forward_order(tmp_path: Path) -> None:
    steps = base_steps()
    changed = replaced(steps, 1, "b", steps[1][1][1] + 0.5)
    changed = replaced(changed, 1, "c", steps[1][2][1] * 2)
    changed = replaced(changed, 2, "a", steps[2][0][1] - 1)
    comparison = compare_runs(load_run(dump(tmp_path / "a", steps)), load_run(dump(tmp_path / "b", changed)))
    assert not comparison.within_tolerance
    first = comparison.first_difference
    assert (first.step, first.name, first.index) == (1, "b", 1)
    mean = next(f for f in first.fields if f.field == "mean")
    assert mean.b - mean.a == pytest.approx(0.5, rel=1e-6)
    assert {"mean", "min", "max"} <= {f.field for f in first.fields} and "std" not in {f.field for f in first.fields}
    assert [len(s.differences) for s in comparison.steps] == [0, 2, 1]
    expected = max(
        abs(stat(changed[1][i][1]) - stat(steps[1][i][1]))
        for i in (1, 2)
        for stat in (torch.mean, torch.min, torch.max, lambda t: t.std(correction=0), lambda t: t.abs().mean())
    )
    assert comparison.steps[1].max_abs_diff == pytest.approx(expected.item(), rel=1e-5)
    assert "step 1, activation 'b'" in format_text(comparison)
    assert "**First difference:** step 1, `b`" in format_markdown(comparison)


def test_tolerances_are_relative_and_absolute_and_symmetric(tmp_path: Path) -> None:
    steps = base_steps()
    nudged = replaced(steps, 0, "a", steps[0][0][1] * (1 + 1e-6))
    a, b = load_run(dump(tmp_path / "a", steps)), load_run(dump(tmp_path / "b", nudged))
    assert compare_runs(a, b, rtol=1e-4, atol=0).within_tolerance
    assert not compare_runs(a, b, rtol=1e-8, atol=0).within_tolerance
    assert not compare_runs(b, a, rtol=1e-8, atol=0).within_tolerance
    assert compare_runs(a, b, rtol=0, atol=1e-3).within_tolerance
    with pytest.raises(ValueError, match="negative"):
        compare_runs(a, b, rtol=-1)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (math.nan, math.nan, True),
        (math.nan, 1.0, False),
        (1.0, math.nan, False),
        (math.inf, math.inf, True),
        (math.inf, -math.inf, False),
        (math.inf, 1e308, False),
        (1.0, 1.0 + 1e-9, True),
        (1.0, 1.1, False),
        (3, 3, True),
        (3, 4, False),  # integers (counts, integer min/max) compare exactly
        (True, False, False),
        ([2, 3], [2, 3], True),
        ("float32", "float16", False),
        (None, 1.0, False),
    ],
)
def test_values_match(a: object, b: object, same: bool) -> None:
    assert values_match(a, b, rtol=1e-6, atol=1e-8) is same


@pytest.mark.parametrize(("a", "b"), [(1.0, 2.0), (-3.0, 2.0), (1e-3, 1.1e-3)])
def test_values_match_is_symmetric(a: float, b: float) -> None:
    for rtol in (0.05, 0.1, 0.5, 0.6):
        assert values_match(a, b, rtol=rtol, atol=0) is values_match(b, a, rtol=rtol, atol=0)
    assert values_match(1.0, 2.0, rtol=0.5, atol=0) and not values_match(1.0, 2.0, rtol=0.49, atol=0)


def test_nan_aware_comparison(tmp_path: Path) -> None:
    steps = base_steps()
    poisoned = steps[0][2][1].clone()
    poisoned[0, 0] = math.nan
    a = load_run(dump(tmp_path / "a", replaced(steps, 0, "c", poisoned)))
    b = load_run(dump(tmp_path / "b", replaced(steps, 0, "c", poisoned.clone())))
    assert compare_runs(a, b).within_tolerance  # NaN in both runs at the same place is not a difference
    clean = load_run(dump(tmp_path / "clean", steps))
    first = compare_runs(clean, a).first_difference
    assert (first.step, first.name) == (0, "c")
    assert {"nan_count", "mean"} <= {f.field for f in first.fields}


def test_shape_and_dtype_differences(tmp_path: Path) -> None:
    steps = base_steps()
    reshaped = replaced(steps, 0, "a", steps[0][0][1].reshape(5, 4))
    retyped = replaced(steps, 0, "a", steps[0][0][1].double())
    reference = load_run(dump(tmp_path / "a", steps))
    assert [
        f.field for f in compare_runs(reference, load_run(dump(tmp_path / "b", reshaped))).first_difference.fields
    ] == ["shape"]
    assert [
        f.field for f in compare_runs(reference, load_run(dump(tmp_path / "c", retyped))).first_difference.fields
    ] == ["dtype"]


def test_activations_and_steps_in_one_run_only_are_reported_not_differences(tmp_path: Path) -> None:
    steps = base_steps()
    fewer = [[(n, t) for n, t in tensors if n != "b"] for tensors in steps[:2]]
    comparison = compare_runs(load_run(dump(tmp_path / "a", steps)), load_run(dump(tmp_path / "b", fewer)))
    assert comparison.within_tolerance and comparison.compared == 4
    assert comparison.steps[0].only_in_a == ["b"] and comparison.steps[0].only_in_b == []
    assert comparison.steps_only_in_a == [2] and comparison.steps_only_in_b == []
    assert "steps only in A (not compared): 2" in format_text(comparison)


def test_load_errors_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="run folder not found"):
        load_run(tmp_path / "missing")
    run = dump(tmp_path / "run", base_steps())
    with pytest.raises(DumpError, match=r"no statistics for rank 1 .*ranks found: 0"):
        load_run(run, rank=1)
    (tmp_path / "empty" / "rank_0").mkdir(parents=True)
    with pytest.raises(DumpError, match="no statistics recorded"):
        load_run(tmp_path / "empty")
    step_file(tmp_path / "empty", 0, 0).write_text("")
    with pytest.raises(DumpError, match="no statistics recorded"):
        load_run(tmp_path / "empty")
    step_file(run, 0, 1).write_text('{"name": "a"}\n')
    with pytest.raises(DumpError, match=r"step_1\.jsonl:1: not a statistics record"):
        load_run(run)
    step_file(run, 0, 1).write_text("not json\n")
    with pytest.raises(DumpError, match=r"step_1\.jsonl:1"):
        load_run(run)
