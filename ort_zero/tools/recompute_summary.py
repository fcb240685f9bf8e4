"""What ort_zero's layer-wise recompute did in one ORT run, in one line, read from the run record's
`training.recompute` (`ort_zero.ort.inspection.ort_run_record`, the example trainers' `ort.json`).

`ort-zero converge` and `benchmarks/bench_zero3.py` describe runs with it, so both say the same thing the same way
and say it plainly when a run asked for recompute and none was applied. The record is
`{"level": int, "layers": [module paths], "plans": {plan name: times applied}, "recomputed_nodes": int}`, read back
from the graph: its level is that of the plans applied (0 when none was, whatever level the run asked for).
"""

from __future__ import annotations

from typing import Any

SHOWN_MODULES = 4  # more are shown as "first ... last"


def recompute_applied(record: dict[str, Any] | None) -> bool:
    """Whether any recompute plan was applied at least once."""
    return record is not None and any(count > 0 for count in record["plans"].values())


def describe_recompute(record: dict[str, Any] | None) -> str:
    """One line: the level, the plans applied with their counts and the modules recomputed; starts with "none
    applied" when no plan was (a run without the record: this ort_zero does not recompute ZeRO-3 graphs at all)."""
    if record is None:
        return "none applied: the run record has no recompute entry (this ort_zero has no layer-wise recompute)"
    if not recompute_applied(record):
        return "none applied (no region of the training graph is recomputed)"
    modules = record["layers"]  # transformer layers, and at level 2 other modules too
    shown = ", ".join(modules) if len(modules) <= SHOWN_MODULES else f"{modules[0]} ... {modules[-1]}"
    plans = ", ".join(f"{plan} x{count}" for plan, count in sorted(record["plans"].items()) if count > 0)
    nodes = record["recomputed_nodes"]
    return f"level {record['level']}: {plans} over {len(modules)} modules ({shown}); {nodes} nodes recomputed"
