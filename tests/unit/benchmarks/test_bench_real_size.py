"""benchmarks/bench_real_size.py: one rank's summary (median step, its CPU and page faults from step 3, RSS drift) and
the step and user-CPU ratios per round."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from .conftest import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """The benchmark, loaded from its file (benchmarks/ is scripts, not a package)."""
    return load_benchmark("bench_real_size")


def rank_record(
    seconds: list[float], faults: list[int], rss: list[float], user: list[float] | None = None
) -> dict[str, Any]:
    user = user or [s / 2 for s in seconds]
    steps = [
        {"seconds": s, "user_s": u, "sys_s": s / 4, "rss_mib": r, "malloced_mib": 100.0, "minor_faults": f}
        | {"faults_by_phase": {"forward": f // 2, "backward": f // 4, "optimizer": f - f // 2 - f // 4}}
        | {"loss": 1.0, "grad_norm": 1.0}
        for s, u, f, r in zip(seconds, user, faults, rss, strict=True)
    ]
    return {"rank": 0, "steps": steps, "peak_rss_mib": max(rss) + 10}


def test_a_rank_summary_skips_the_first_two_steps(bench: ModuleType) -> None:
    record = rank_record([9.0, 5.0, 4.0, 4.4, 4.2], [900_000, 700_000, 500_000, 520_000, 510_000], [1, 2, 100, 90, 102])
    summary = bench.summary(record)
    assert summary["first_step_s"] == 9.0
    assert summary["median_step_s"] == 4.2
    assert summary["faults_k"] == 510
    phases = [summary[f"{phase}_faults_k"] for phase in ("forward", "backward", "optimizer")]
    assert phases == [255, 127.5, 127.5]  # the medians of each phase's thousands of pages
    assert summary["rss_drift_pct"] == pytest.approx(2.0)
    assert summary["user_s"] == 2.1 and summary["sys_s"] == pytest.approx(1.05)
    assert summary["off_cpu_s"] == pytest.approx(4.2 - 2.1 - 1.05)


def test_rounds_report_each_rounds_ratio_and_their_median(bench: ModuleType) -> None:
    def round_of(native: float, ort: float, ort_user: float) -> dict[str, list[dict[str, Any]]]:
        return {
            mode: [rank_record([9.0, 5.0, s, s, s], [0] * 5, [1.0] * 5, [2.0, 2.0, u, u, u])]
            for mode, s, u in (("native", native, 2.0), ("ort", ort, ort_user))
        }

    line = bench.rounds_line([round_of(4.0, 4.4, 1.8), round_of(5.0, 4.5, 1.9), round_of(4.0, 4.0, 2.2)])
    assert "3 rounds" in line
    assert "ORT / native 1.10x, 0.90x, 1.00x (median 1.00x)" in line
    assert "user CPU per step ORT / native 0.90x, 0.95x, 1.10x (median 0.95x)" in line
