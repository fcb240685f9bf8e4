"""benchmarks/bench_report.py: rounds merged per rank, ratios to the baseline configuration, the recompute lines."""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

import pytest

from .conftest import load_benchmark


@pytest.fixture(scope="module")
def report() -> ModuleType:
    """The benchmark's report module, loaded from its file (benchmarks/ is scripts, not a package)."""
    return load_benchmark("bench_report")


def rank(step_ms: list[float], peak: float, growth: float, **extra: Any) -> dict[str, Any]:
    """One rank's merged result; it started training at 600 MiB."""
    return {
        "step_ms": step_ms, "losses": [5.5, 5.25], "peak_rss_mib": peak + 50, "step_peak_rss_mib": peak,
        "peak_above_start_mib": peak - 600, "step_rss_growth_mib": growth, "python_peak_mib": 0.5,
        "gpu_peak_mib": None, **extra,
    }  # fmt: skip


def table(output: str) -> dict[str, list[str]]:
    """Markdown rows by config name, as stripped cells."""
    rows = [line.strip("|").split("|") for line in output.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [cell.strip() for cell in cells] for cells in rows}


def test_merge_rounds_keeps_every_step_and_the_highest_peaks(report: ModuleType) -> None:
    first = [rank([10.0, 12.0], 800, 100, recompute=None), rank([11.0], 900, 90, recompute=None)]
    second = [rank([30.0], 700, 120, recompute={"level": 1}), rank([13.0], 950, 80, recompute={"level": 1})]
    merged = report.merge_rounds([first, second])
    assert [m["step_ms"] for m in merged] == [[10.0, 12.0, 30.0], [11.0, 13.0]]
    assert [m["step_peak_rss_mib"] for m in merged] == [800, 950]
    assert [m["step_rss_growth_mib"] for m in merged] == [120, 90]
    assert [m["recompute"] for m in merged] == [{"level": 1}, {"level": 1}]


def test_ratios_are_to_the_baseline_and_recompute_is_listed_per_ort_config(
    report: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    applied = {"level": 1, "layers": ["blocks.0"], "plans": {"layer": 1}, "recomputed_nodes": 9}
    rows = [
        ("native-z3", [rank([100.0, 300.0], 1000, 400), rank([200.0], 1000, 400)]),
        ("native-z3-ckpt", [rank([250.0], 800, 200), rank([250.0], 800, 100)]),
        ("ort-z3", [rank([200.0], 1200, 100, recompute=None), rank([200.0], 1200, 100, recompute=None)]),
        ("ort-z3-l1", [rank([125.0], 700, 0, recompute=applied), rank([125.0], 600, 50, recompute=None)]),
    ]
    args = argparse.Namespace(baseline="native-z3-ckpt", steps=1, rounds=1, nproc=2, warmup=1)
    report.print_table("GPT", rows, args)
    output = capsys.readouterr().out
    cells = table(output)
    header = cells["config"]
    step, peak, above, growth = (
        header.index(name)
        for name in ("step vs baseline", "peak vs baseline", "above start vs baseline", "growth vs baseline")
    )
    assert cells["native-z3"][step] == "0.80x"  # median of rank 0's steps: 200 / 250
    assert cells["native-z3-ckpt"][step] == "1.00x" and cells["ort-z3-l1"][step] == "0.50x"
    assert cells["ort-z3-l1"][peak] == "0.88x / 0.75x"
    assert cells["ort-z3-l1"][above] == "0.50x / 0.00x"  # (700 - 600) / (800 - 600)
    assert cells["ort-z3-l1"][growth] == "0.00x / 0.50x"
    assert "ratios to native-z3-ckpt" in output
    assert "- ort-z3: none applied: the run record has no recompute entry" in output
    ranks_differ = (
        "- ort-z3-l1: rank 0: level 1: layer x1 over 1 modules (blocks.0); 9 nodes recomputed; rank 1: none applied"
    )
    assert ranks_differ in output
    assert "- native-z3" not in output  # native runs have no ORT graph to recompute


def test_no_ratio_without_the_baseline_or_with_a_zero_in_it(report: ModuleType) -> None:
    ranks = [rank([1.0], 10, 0), rank([1.0], 10, 5)]
    assert report.per_rank_ratio(ranks, None, "step_rss_growth_mib") == "-"
    assert report.per_rank_ratio(ranks, ranks, "step_rss_growth_mib") == "-"
    assert report.per_rank_ratio(ranks, ranks, "step_peak_rss_mib") == "1.00x / 1.00x"
