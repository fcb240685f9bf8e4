"""Between steps, an ORT-ZeRO3 rank holds no more memory than a native ZeRO-3 rank, and it does not grow.

The Trainer job of `benchmarks/real_size_worker.py` (a LLaMA from config whose parameters dominate: hidden 512,
vocab 16000, 29M parameters, AdamW), `transformers.Trainer` and `ORTZeroTrainer`, 2 ranks each under torchrun. What
training adds to a rank's RSS (RSS after a step above RSS before training), pooled over both ranks and steps 3 to 10:
ORT's median within 1.25x of native's. Before ORT training sessions returned the heap's free pages after each
backward it was 1.76x (ORT leaves more freed memory in glibc's heap than PyTorch does); with it, 0.98-1.16x in
runs on a loaded machine: at this size where the optimizer's temporaries land in the heap moves the median by up to
15% from run to run. At the sizes people train the benchmark has ORT at 0.75-0.96x (docs/benchmarks.md, issue 22).

Nothing accumulates from step to step: the live heap (what malloc handed out and did not get back, after a garbage
collection) rises by at most 1% from step 3 to the last (measured: 637 -> 640 MiB over 25 steps, native 469 -> 472).
RSS cannot tell: glibc keeps a varying share of the freed heap, so RSS after a step moves by +-5% from step to step in
both modes, and a median of three steps rose by 5.5% under ORT in a CI run and by 4-7% natively in runs here.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "benchmarks" / "real_size_worker.py"
STEPS = 10
MODEL = ["--hidden", "512", "--layers", "4", "--heads", "8", "--intermediate", "1376", "--vocab", "16000"]


def added_by_training(out: Path, mode: str) -> tuple[list[float], list[dict]]:
    """RSS after each of steps 3.. above RSS before training, both ranks pooled; and the ranks' results."""
    ranks = [json.loads((out / f"{mode}-rank{rank}.json").read_text()) for rank in range(2)]
    added = [step["rss_mib"] - rank["rss_before_train_mib"] for rank in ranks for step in rank["steps"][2:]]
    return added, ranks


def test_ort_holds_no_more_than_native_between_steps(tmp_path: Path) -> None:
    config = str(ROOT / "ds_configs" / "zero3_hf_auto.json")
    for mode in ("native", "ort"):
        args = ["--mode", mode, *MODEL, "--steps", str(STEPS), "--deepspeed", config, "--out", str(tmp_path)]
        run_launcher(torchrun_cmd(WORKER, args, port=free_port(), nproc=2), timeout=600)
    native, native_ranks = added_by_training(tmp_path, "native")
    ort, ort_ranks = added_by_training(tmp_path, "ort")
    for ranks in (native_ranks, ort_ranks):
        assert all(len(rank["steps"]) == STEPS for rank in ranks)
    ort_losses = [step["loss"] for step in ort_ranks[0]["steps"]]
    native_losses = [step["loss"] for step in native_ranks[0]["steps"]]
    assert max(abs(a - b) for a, b in zip(ort_losses, native_losses, strict=True)) < 1e-4
    assert ort_ranks[0]["ort_phases"].get("session creation") is not None, "ORT built no session"
    ratio = statistics.median(ort) / statistics.median(native)
    assert ratio <= 1.25, f"ORT holds {ratio:.2f}x native between steps: ORT {ort}, native {native} MiB"
    for rank in ort_ranks:
        live = [step["malloced_mib"] for step in rank["steps"]]
        assert live[-1] <= 1.01 * live[2], f"rank {rank['rank']}: the live heap grows step by step: {live} MiB"
