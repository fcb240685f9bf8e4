"""What ort_zero's layer-wise recompute did in one ORT run, in one line, read from the run record's
`training.recompute` (`ort_zero.ort.inspection.ort_run_record`, the example trainers' `ort.json`).

`ort-zero converge` and `benchmarks/bench_zero3.py` describe runs with it, so both say the same thing the same way
and say it plainly when a run asked for recompute and none was applied. The record is
`{"level": int, "layers": [module paths], "plans": {plan name: times applied}, "recomputed_nodes": int}`.
"""

from __future__ import annotations

from typing import Any

SHOWN_LAYERS = 4  # more layers are shown as "first ... last"


def recompute_applied(record: dict[str, Any] | None) -> bool:
    """Whether any recompute plan was applied at least once."""
    return record is not None and any(count > 0 for count in record["plans"].values())


def describe_recompute(record: dict[str, Any] | None) -> str:
    """One line: the level, the recomputed layers and plans with their counts; starts with "none applied" when no
    plan was (a run without the record: this ort_zero does not recompute ZeRO-3 graphs at all)."""
    if record is None:
        return "none applied: the run record has no recompute entry (this ort_zero has no layer-wise recompute)"
    level = record["level"]
    if not recompute_applied(record):
        why = "recompute off" if level == 0 else "no recompute plan matched the graph"
        return f"none applied at level {level} ({why})"
    layers = record["layers"]
    shown = ", ".join(layers) if len(layers) <= SHOWN_LAYERS else f"{layers[0]} ... {layers[-1]}"
    plans = ", ".join(f"{plan} x{count}" for plan, count in sorted(record["plans"].items()) if count > 0)
    return (
        f"level {level}: {len(layers)} layers ({shown}); plans: {plans}; {record['recomputed_nodes']} nodes recomputed"
    )
