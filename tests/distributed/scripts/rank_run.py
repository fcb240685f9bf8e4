"""What every 2-rank test script does around its training: ort_zero's hooks unless native, the process group, one
JSON result per rank (with ORT's run record when the model ran in ORT), and the process group's end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def start(mode: str) -> int:
    """Enable ort_zero's ZeRO-3 hooks unless `mode` is "native"; join the process group; this process's rank."""
    if mode != "native":
        import ort_zero

        ort_zero.enable_zero3()
    from ort_zero.distributed import init_distributed

    rank, _ = init_distributed()
    return rank


def write_result(out: Path, rank: int, result: dict[str, Any], ort_model: Any = None) -> None:
    """`<out>/rank<rank>.json`; with `ort_model` (an ORTModule, or an engine around one) its run record as "ort"."""
    if ort_model is not None:
        from ort_zero.ort.inspection import ort_run_record

        result["ort"] = ort_run_record(ort_model)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def finish() -> None:
    """End the process group as ort_zero's entry points do (gloo's workers done before the interpreter exits)."""
    from ort_zero.distributed import shut_down_distributed

    shut_down_distributed()
