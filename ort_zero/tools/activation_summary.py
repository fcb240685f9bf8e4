"""Load the statistics dumps of two runs and find the first step and activation where they part.

Reads what `ort_zero.hooks.statistics.StatisticsSubscriber` writes (`<run>/rank_<r>/step_<s>.jsonl`). Activations
are matched by name within a step; floating-point statistics must agree within `atol + rtol * max(|a|, |b|)`
(symmetric, so swapping the runs gives the same verdict; NaN matches NaN, an infinity matches only itself),
integer ones (counts, integer min/max), shapes and dtypes exactly. A step or activation present in one run only
is reported but is not a difference (e.g. a run recorded with a narrower step window).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hooks.statistics import rank_dir

_RANK_DIR = re.compile(r"rank_(\d+)")
_STEP_FILE = re.compile(r"step_(\d+)\.jsonl")


class DumpError(ValueError):
    """A run folder that cannot be compared: missing, without dumps for the rank, empty, or malformed."""


@dataclass(frozen=True)
class Activation:
    """One recorded tensor of one step: its name, kind, position in forward order, and its statistics."""

    name: str
    kind: str
    index: int
    stats: dict[str, Any]


@dataclass(frozen=True)
class RunDump:
    path: Path
    rank: int
    steps: dict[int, list[Activation]]


@dataclass(frozen=True)
class FieldDiff:
    field: str
    a: Any
    b: Any


@dataclass(frozen=True)
class ActivationDiff:
    """An activation whose statistics differ beyond tolerance; `fields` lists the statistics that do."""

    step: int
    name: str
    index: int
    fields: list[FieldDiff]


@dataclass(frozen=True)
class StepComparison:
    step: int
    compared: int
    differences: list[ActivationDiff]  # in run A's forward order
    only_in_a: list[str]
    only_in_b: list[str]
    max_abs_diff: float  # largest |a - b| over the finite floating-point statistics compared

    @property
    def first_difference(self) -> ActivationDiff | None:
        return self.differences[0] if self.differences else None


@dataclass(frozen=True)
class RunComparison:
    run_a: Path
    run_b: Path
    rank: int
    rtol: float
    atol: float
    steps: list[StepComparison]  # the steps both runs recorded, in order
    steps_only_in_a: list[int]
    steps_only_in_b: list[int]

    @property
    def compared(self) -> int:
        return sum(step.compared for step in self.steps)

    @property
    def first_difference(self) -> ActivationDiff | None:
        """The earliest step's first differing activation in forward order: where to start looking."""
        return next((step.first_difference for step in self.steps if step.differences), None)

    @property
    def within_tolerance(self) -> bool:
        return self.first_difference is None


def available_ranks(run_dir: str | Path) -> list[int]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in run_dir.iterdir() if p.is_dir() and (m := _RANK_DIR.fullmatch(p.name)))


def load_run(run_dir: str | Path, rank: int = 0) -> RunDump:
    """Every step dumped by `rank` under `run_dir`; DumpError says what is missing or malformed."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DumpError(f"run folder not found: {run_dir}")
    folder = rank_dir(run_dir, rank)
    if not folder.is_dir():
        ranks = available_ranks(run_dir)
        found = f"ranks found: {', '.join(map(str, ranks))}" if ranks else "no rank_<r> folders found"
        raise DumpError(f"no statistics for rank {rank} in {run_dir} ({found})")
    steps: dict[int, list[Activation]] = {}
    for path in folder.iterdir():
        match = _STEP_FILE.fullmatch(path.name)
        if match and path.is_file():
            steps[int(match.group(1))] = _read_step(path)
    if not any(steps.values()):
        raise DumpError(f"no statistics recorded in {folder} (no step_<s>.jsonl files, or only empty ones)")
    return RunDump(run_dir, rank, dict(sorted(steps.items())))


def _read_step(path: Path) -> list[Activation]:
    activations = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            name, kind, index = (entry.pop(key) for key in ("name", "kind", "index"))
            activations.append(Activation(str(name), str(kind), int(index), entry))
        except (ValueError, KeyError, AttributeError, TypeError) as error:  # JSONDecodeError is a ValueError
            raise DumpError(f"{path}:{number}: not a statistics record ({error!r})") from error
    return sorted(activations, key=lambda activation: activation.index)


def values_match(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """Floats within tolerance (NaN matches NaN, an infinity only itself); anything else must be equal."""
    if not (isinstance(a, float) or isinstance(b, float)) or not _is_number(a) or not _is_number(b):
        return a == b
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def compare_runs(a: RunDump, b: RunDump, rtol: float = 1e-4, atol: float = 1e-6) -> RunComparison:
    """Every step both runs recorded, activation by activation; see RunComparison.first_difference."""
    if rtol < 0 or atol < 0:
        raise ValueError(f"tolerances must not be negative (rtol={rtol}, atol={atol})")
    common = sorted(a.steps.keys() & b.steps.keys())
    return RunComparison(
        run_a=a.path,
        run_b=b.path,
        rank=a.rank,
        rtol=rtol,
        atol=atol,
        steps=[_compare_step(step, a.steps[step], b.steps[step], rtol, atol) for step in common],
        steps_only_in_a=sorted(a.steps.keys() - b.steps.keys()),
        steps_only_in_b=sorted(b.steps.keys() - a.steps.keys()),
    )


def _compare_step(step: int, a: list[Activation], b: list[Activation], rtol: float, atol: float) -> StepComparison:
    by_name = {activation.name: activation for activation in b}
    names_a = {activation.name for activation in a}
    differences, max_abs_diff, compared = [], 0.0, 0
    for activation in a:
        other = by_name.get(activation.name)
        if other is None:
            continue
        compared += 1
        fields = []
        for field in dict.fromkeys([*activation.stats, *other.stats]):
            value_a, value_b = activation.stats.get(field), other.stats.get(field)
            if not values_match(value_a, value_b, rtol, atol):
                fields.append(FieldDiff(field, value_a, value_b))
            if isinstance(value_a, float) and isinstance(value_b, float) and math.isfinite(value_a - value_b):
                max_abs_diff = max(max_abs_diff, abs(value_a - value_b))
        if fields:
            differences.append(ActivationDiff(step, activation.name, activation.index, fields))
    return StepComparison(
        step=step,
        compared=compared,
        differences=differences,
        only_in_a=[activation.name for activation in a if activation.name not in by_name],
        only_in_b=[activation.name for activation in b if activation.name not in names_a],
        max_abs_diff=max_abs_diff,
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def describe(diff: ActivationDiff, limit: int = 4) -> str:
    """`name` at step s: which statistics differ, with both values (the first `limit` of them)."""
    shown = ", ".join(f"{f.field} {f.a!r} vs {f.b!r}" for f in diff.fields[:limit])
    more = f", and {len(diff.fields) - limit} more" if len(diff.fields) > limit else ""
    return f"step {diff.step}, activation '{diff.name}' (#{diff.index} in forward order): {shown}{more}"


def format_text(comparison: RunComparison) -> str:
    """One line per step, then the verdict naming the first differing step and activation."""
    lines = [
        f"A: {comparison.run_a}",
        f"B: {comparison.run_b}",
        f"rank {comparison.rank}, rtol {comparison.rtol:g}, atol {comparison.atol:g}",
    ]
    for step in comparison.steps:
        line = f"step {step.step}: {step.compared} compared, {len(step.differences)} differ"
        line += f", max |diff| {step.max_abs_diff:.3g}"
        if step.first_difference:
            line += f", first: {step.first_difference.name}"
        if step.only_in_a or step.only_in_b:
            line += f" (not compared: {len(step.only_in_a)} only in A, {len(step.only_in_b)} only in B)"
        lines.append(line)
    lines.extend(_run_level_notes(comparison))
    first = comparison.first_difference
    lines.append(f"first difference: {describe(first)}" if first else "all compared statistics within tolerance")
    return "\n".join(lines)


def format_markdown(comparison: RunComparison) -> str:
    """The same summary as a Markdown report: a per-step table, the first difference, and what was not compared."""
    lines = [
        "# Activation statistics: A vs B",
        "",
        f"- A: `{comparison.run_a}`",
        f"- B: `{comparison.run_b}`",
        f"- rank {comparison.rank}, rtol {comparison.rtol:g}, atol {comparison.atol:g}",
        "",
        "| step | compared | differ | max abs diff | first differing activation | only in A | only in B |",
        "|---:|---:|---:|---:|---|---:|---:|",
    ]
    for step in comparison.steps:
        first = f"`{step.first_difference.name}`" if step.first_difference else ""
        lines.append(
            f"| {step.step} | {step.compared} | {len(step.differences)} | {step.max_abs_diff:.3g} | {first} "
            f"| {len(step.only_in_a)} | {len(step.only_in_b)} |"
        )
    lines.append("")
    first = comparison.first_difference
    if first is None:
        lines.append("**All compared statistics are within tolerance.**")
    else:
        lines += [f"**First difference:** step {first.step}, `{first.name}` (#{first.index} in forward order)", ""]
        lines += ["| statistic | A | B |", "|---|---|---|"]
        lines += [f"| {f.field} | {f.a!r} | {f.b!r} |" for f in first.fields]
    notes = _run_level_notes(comparison)
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def _run_level_notes(comparison: RunComparison) -> list[str]:
    notes = []
    if comparison.steps_only_in_a:
        notes.append(f"steps only in A (not compared): {_ranges(comparison.steps_only_in_a)}")
    if comparison.steps_only_in_b:
        notes.append(f"steps only in B (not compared): {_ranges(comparison.steps_only_in_b)}")
    return notes


def _ranges(steps: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], steps[0]
    for previous, step in zip(steps, [*steps[1:], None], strict=True):
        if step != previous + 1:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = step
    return ", ".join(parts)
