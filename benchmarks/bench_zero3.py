"""Step time and peak memory per rank: native DeepSpeed ZeRO-3 vs PyTorch-ZeRO3 vs ORT-ZeRO3 (and ZeRO-2 with and
without memory-efficient gradients), side by side in one run.

    .venv/bin/python benchmarks/bench_zero3.py                      # small GPT 4 x 256, seq 128, micro-batch 4
    .venv/bin/python benchmarks/bench_zero3.py --model mlp          # a wide MLP, where gradients dominate memory
    .venv/bin/python benchmarks/bench_zero3.py --sweep-depth 4 8 16 --configs native-z3 torch-z3 ort-z3
        # a Linear(2048) stack built under zero.Init, ZeRO-3 releasing as early as it can, at each depth: how the
        # memory a rank needs grows with depth (MALLOC_MMAP_THRESHOLD_=65536, so freed tensors leave RSS at once)

Each configuration runs under torchrun on 2 local ranks (gloo on CPU). Reported per configuration: the median step
time over the measured steps (after warm-up, which includes ORT's export), the ratio to native ZeRO-3, per rank
the process's peak RSS and how far the measured steps pushed RSS above where they started (sampled every
millisecond: torch's CPU allocator is invisible to `tracemalloc`, which gives the Python-side peak), the GPU
allocator's peak on CUDA, and the last loss (configurations that must compute the same numbers show the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ort_zero.tools.process_tree import free_port

CONFIGS = {
    "native-z3": ["--mode", "native", "--stage", "3"],
    "torch-z3": ["--mode", "torch", "--stage", "3"],
    "ort-z3": ["--mode", "ort", "--stage", "3"],
    "native-z2": ["--mode", "native", "--stage", "2"],
    "ort-z2": ["--mode", "ort", "--stage", "2"],
    "ort-z2-memgrad": ["--mode", "ort", "--stage", "2", "--mem-grads"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["gpt", "mlp"], default="gpt")
    parser.add_argument("--steps", type=int, default=20, help="measured steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="run every configuration this many times, in turn")
    parser.add_argument("--profile", type=Path, help="also cProfile rank 0: writes PROFILE/<config>/rank0.pstats")
    parser.add_argument("--sweep-depth", type=int, nargs="*", help="the Linear stack at each of these depths")
    args = parser.parse_args()

    if args.sweep_depth:
        for depth in args.sweep_depth:
            rows = run_configs(args, ["--model", "stack", "--depth", str(depth)], {"MALLOC_MMAP_THRESHOLD_": "65536"})
            print_table(f"stack of {depth} x Linear(2048)", rows, args)
    else:
        print_table(f"model {args.model}", run_configs(args, ["--model", args.model], {}), args)
    return 0


def run_configs(args: argparse.Namespace, model_args: list[str], env: dict[str, str]) -> list[tuple[str, list]]:
    """Every configuration, round-robin over the rounds (a slow spell of the machine then hits all of them)."""
    worker = Path(__file__).with_name("bench_worker.py")
    runs: dict[str, list[list[dict]]] = {name: [] for name in args.configs}  # per config: each round's ranks
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            for name in args.configs:
                out = (args.profile or Path(scratch)) / f"{name}-{'-'.join(model_args)}-{round_index}"
                command = [
                    sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}",
                    "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(worker),
                    *CONFIGS[name], *model_args, "--steps", str(args.steps), "--warmup", str(args.warmup),
                    "--out", str(out), *(["--profile"] if args.profile else []),
                ]  # fmt: skip
                run_env = dict(os.environ, DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"), **env)
                run_env.update(ORTMODULE_FALLBACK_POLICY="FALLBACK_DISABLE", TORCH_WARM_POOL="0")
                result = subprocess.run(command, capture_output=True, text=True, env=run_env, timeout=1800)
                if result.returncode != 0:
                    raise SystemExit(f"{name}: FAILED\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
                runs[name].append([json.loads((out / f"rank{r}.json").read_text()) for r in range(args.nproc)])
                print(f"[bench] round {round_index + 1}/{args.rounds}: {name} done", file=sys.stderr, flush=True)
    return [(name, merge_rounds(rounds)) for name, rounds in runs.items()]


def print_table(title: str, rows: list[tuple[str, list]], args: argparse.Namespace) -> None:
    native = next((statistics.median(r[0]["step_ms"]) for n, r in rows if n == "native-z3"), None)
    native_growth = next((r for n, r in rows if n == "native-z3"), None)
    measured = args.steps * args.rounds
    print(
        f"\n{title}, {args.nproc} ranks, median of {measured} steps ({args.rounds} rounds, each after "
        f"{args.warmup} warm-up steps)\n"
    )
    print(
        "| config | median step ms | vs native-z3 | peak RSS MiB per rank | RSS growth in steps MiB per rank "
        "| growth vs native-z3 | Python peak MiB | GPU peak MiB | last loss |"
    )
    print("|---|---:|---:|---|---|---|---:|---:|---:|")
    for name, ranks in rows:
        median = statistics.median(ranks[0]["step_ms"])
        ratio = f"{median / native:.2f}x" if native else "-"
        peaks = " / ".join(f"{r['peak_rss_mib']:.0f}" for r in ranks)
        growth = " / ".join(f"{r['step_rss_growth_mib']:.0f}" for r in ranks)
        growth_ratio = (
            " / ".join(
                f"{r['step_rss_growth_mib'] / n['step_rss_growth_mib']:.2f}x"
                for r, n in zip(ranks, native_growth, strict=True)
            )
            if native_growth
            else "-"
        )
        gpu = " / ".join(f"{r['gpu_peak_mib']:.0f}" for r in ranks) if ranks[0]["gpu_peak_mib"] else "-"
        print(
            f"| {name} | {median:.1f} | {ratio} | {peaks} | {growth} | {growth_ratio} "
            f"| {ranks[0]['python_peak_mib']:.1f} | {gpu} | {ranks[0]['losses'][-1]:.6f} |"
        )


MEMORY_PEAKS = ("peak_rss_mib", "step_rss_growth_mib", "python_peak_mib")


def merge_rounds(rounds: list[list[dict]]) -> list[dict]:
    """Per rank: every round's step times together, the highest memory peaks, the last round's losses."""
    merged = []
    for rank_runs in zip(*rounds, strict=True):
        peaks = {key: max(run[key] for run in rank_runs) for key in MEMORY_PEAKS}
        gpu = [run["gpu_peak_mib"] for run in rank_runs if run["gpu_peak_mib"] is not None]
        step_ms = [ms for run in rank_runs for ms in run["step_ms"]]
        last_losses = rank_runs[-1]["losses"]
        merged.append({"step_ms": step_ms, "losses": last_losses, "gpu_peak_mib": max(gpu, default=None), **peaks})
    return merged


if __name__ == "__main__":
    sys.exit(main())
