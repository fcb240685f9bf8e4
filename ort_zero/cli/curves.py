"""Loss curves of two runs of one job, read and judged: per step within a relative tolerance, and for 16-bit runs
within the spread the reference shows against itself when it sums in another order."""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

# Beyond the tolerance, a 16-bit ORT run may differ from PyTorch at a step by at most this times the largest difference
# PyTorch with another reduction order (the same job with another number of threads) showed from itself so far.
SPREAD_FACTOR = 2.0


@dataclass
class Curve:
    steps: list[int]
    losses: list[float]
    times_ms: list[float]


def read_curve(path: Path) -> Curve:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return Curve([int(r["step"]) for r in rows], [float(r["loss"]) for r in rows], [float(r["time_ms"]) for r in rows])


@dataclass
class Verdict:
    agree: bool
    max_abs_diff: float
    max_rel_diff: float
    first_divergence: int | None
    summary: str


def compare(reference: Curve, candidate: Curve, rtol: float) -> Verdict:
    if reference.steps != candidate.steps:
        return Verdict(False, float("inf"), float("inf"), None, "the runs logged different steps")
    diffs = [abs(a - b) for a, b in zip(reference.losses, candidate.losses, strict=True)]
    rels = [d / max(abs(a), 1e-12) for d, a in zip(diffs, reference.losses, strict=True)]
    first = next((step for step, rel in zip(reference.steps, rels, strict=True) if rel > rtol), None)
    agree = first is None
    summary = (
        f"[converge] {'AGREE' if agree else 'DIVERGE'}: max |loss diff| {max(diffs):.3g}, max relative "
        f"{max(rels):.3g} (tolerance {rtol:g})" + ("" if agree else f", first beyond tolerance at step {first}")
    )
    return Verdict(agree, max(diffs), max(rels), first, summary)


def within_own_spread(
    verdict: Verdict, reference: Curve, candidate: Curve, reordered: Curve, rtol: float, precision: str, threads: int
) -> Verdict:
    """The 16-bit verdict: a step of ORT beyond the tolerance agrees still if it is within SPREAD_FACTOR times the
    largest difference PyTorch with another reduction order has shown from PyTorch by then (16-bit rounding, amplified
    by the optimizer, is then the training's own spread, not ORT's). The running largest, not the same step: one
    sample of a chaotic parting tells its size, not its step to the step."""
    if verdict.agree:
        return verdict
    spread = compare(reference, reordered, rtol)
    if spread.max_rel_diff == float("inf"):
        return replace(verdict, summary=verdict.summary + "; the reordered run logged other steps")
    envelope, beyond = 0.0, None
    for step, ref, ort, other in zip(
        reference.steps, reference.losses, candidate.losses, reordered.losses, strict=True
    ):
        scale = max(abs(ref), 1e-12)
        envelope = max(envelope, abs(other - ref) / scale)
        if abs(ort - ref) / scale > max(rtol, SPREAD_FACTOR * envelope) and beyond is None:
            beyond = step
    agree = beyond is None
    parted = f"first at step {spread.first_divergence}" if spread.first_divergence is not None else "nowhere"
    summary = (
        f"[converge] {'AGREE' if agree else 'DIVERGE'} ({'within' if agree else 'beyond'} {precision}'s own spread)"
        + ("" if agree else f" at step {beyond}")
        + f": ORT: {verdict.summary.split(': ', 1)[1]}; PyTorch with another reduction order "
        f"(OMP_NUM_THREADS={threads}) parts from PyTorch {parted}, max relative {spread.max_rel_diff:.3g}"
    )
    return replace(verdict, agree=agree, summary=summary)
