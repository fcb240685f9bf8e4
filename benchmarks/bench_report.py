"""The tables `bench_zero3.py` prints: per configuration, step time, memory per rank and ratios to a baseline
configuration, and what ort_zero's layer-wise recompute applied in each ORT-ZeRO3 run."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from ort_zero.tools.recompute_summary import describe_recompute

Ranks = list[dict[str, Any]]  # one merged result per rank
MEMORY_PEAKS = ("peak_rss_mib", "step_peak_rss_mib", "peak_above_start_mib", "step_rss_growth_mib", "python_peak_mib")


def merge_rounds(rounds: list[Ranks]) -> Ranks:
    """Per rank: every round's step times together, the highest memory peaks, the last round's losses and recompute
    record (the same graph in every round)."""
    merged = []
    for rank_runs in zip(*rounds, strict=True):
        peaks = {key: max(run[key] for run in rank_runs) for key in MEMORY_PEAKS}
        gpu = [run["gpu_peak_mib"] for run in rank_runs if run["gpu_peak_mib"] is not None]
        last = rank_runs[-1]
        merged.append(
            {
                "step_ms": [ms for run in rank_runs for ms in run["step_ms"]],
                "losses": last["losses"],
                "gpu_peak_mib": max(gpu, default=None),
                **({"recompute": last["recompute"]} if "recompute" in last else {}),
                **peaks,
            }
        )
    return merged


def per_rank_ratio(ranks: Ranks, baseline: Ranks | None, key: str) -> str:
    """`ranks[key] / baseline[key]` for each rank, e.g. "0.61x / 0.60x"; "-" without a baseline or a zero in it."""
    if baseline is None or any(b[key] <= 0 for b in baseline):
        return "-"
    return " / ".join(f"{r[key] / b[key]:.2f}x" for r, b in zip(ranks, baseline, strict=True))


def print_table(title: str, rows: list[tuple[str, Ranks]], args: argparse.Namespace) -> None:
    """The Markdown table of one model size; ratios are to `args.baseline` (rank by rank for memory)."""
    base = dict(rows).get(args.baseline)
    base_median = statistics.median(base[0]["step_ms"]) if base else None
    measured = args.steps * args.rounds
    print(
        f"\n{title}, {args.nproc} ranks, median of {measured} steps ({args.rounds} rounds, each after "
        f"{args.warmup} warm-up steps); ratios to {args.baseline}\n"
    )
    print(
        "| config | median step ms | step vs baseline | peak RSS in steps MiB per rank | peak vs baseline "
        "| peak above start MiB per rank | above start vs baseline | RSS growth in steps MiB per rank "
        "| growth vs baseline | process peak RSS MiB | Python peak MiB | GPU peak MiB | last loss |"
    )
    print("|---|---:|---:|---|---|---|---|---|---|---|---:|---:|---:|")
    for name, ranks in rows:
        median = statistics.median(ranks[0]["step_ms"])
        ratio = f"{median / base_median:.2f}x" if base_median else "-"
        memory = [
            f"{' / '.join(f'{r[key]:.0f}' for r in ranks)} | {per_rank_ratio(ranks, base, key)}"
            for key in ("step_peak_rss_mib", "peak_above_start_mib", "step_rss_growth_mib")
        ]
        process_peaks = " / ".join(f"{r['peak_rss_mib']:.0f}" for r in ranks)
        gpu = " / ".join(f"{r['gpu_peak_mib']:.0f}" for r in ranks) if ranks[0]["gpu_peak_mib"] else "-"
        print(
            f"| {name} | {median:.1f} | {ratio} | {' | '.join(memory)} | {process_peaks} "
            f"| {ranks[0]['python_peak_mib']:.1f} | {gpu} | {ranks[0]['losses'][-1]:.6f} |"
        )
    recomputes = [(name, ranks) for name, ranks in rows if "recompute" in ranks[0]]
    if recomputes:
        print("\nRecompute applied by ort_zero (ort_run_record: training.recompute):\n")
        for name, ranks in recomputes:
            print(f"- {name}: {describe_ranks([r['recompute'] for r in ranks])}")


def describe_ranks(records: list[dict[str, Any] | None]) -> str:
    """One description when every rank's record says the same, else one per rank."""
    texts = [describe_recompute(record) for record in records]
    if len(set(texts)) == 1:
        return texts[0]
    return "; ".join(f"rank {rank}: {text}" for rank, text in enumerate(texts))
