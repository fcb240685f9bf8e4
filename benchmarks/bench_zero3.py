"""Step time and peak memory per rank: native DeepSpeed ZeRO-3 (with and without gradient checkpointing) vs
PyTorch-ZeRO3 vs ORT-ZeRO3 (with ort_zero's layer-wise recompute at ORTMODULE_MEMORY_OPT_LEVEL 0, 1, 2), and ZeRO-2 with
and without memory-efficient gradients, side by side in one run.

    .venv/bin/python benchmarks/bench_zero3.py                      # small GPT 4 x 256, seq 128, micro-batch 4
    .venv/bin/python benchmarks/bench_zero3.py --model mlp          # a wide MLP, where gradients dominate memory
    .venv/bin/python benchmarks/bench_zero3.py --sweep-depth 4 8 16 --configs native-z3 torch-z3 ort-z3
        # a Linear(2048) stack built under zero.Init, ZeRO-3 releasing as early as it can, at each depth: how the
        # memory a rank needs grows with depth (MALLOC_MMAP_THRESHOLD_=65536, so freed tensors leave RSS at once)
    .venv/bin/python benchmarks/bench_zero3.py --sweep-gpt-depth 4 8 16 --seq-len 512 --micro-batch 1
        # the GPT at each depth, where activations dominate: ORT's recompute (ort-z3-l1, ort-z3-l2) against native
        # ZeRO-3 with torch.utils.checkpoint on every block (native-z3-ckpt, the baseline of the ratios); freed
        # memory leaves RSS at once in torch (MALLOC_MMAP_THRESHOLD_) and in ORT (its CPU arena off)

Each configuration runs under torchrun on 2 local ranks (gloo on CPU). Reported per configuration: the median step
time over the measured steps (after warm-up, which includes ORT's export) and its ratio to the baseline; per rank,
with ratios to the baseline's same rank: the peak RSS within the measured steps (sampled every millisecond: torch's
CPU allocator is invisible to `tracemalloc`, which gives the Python-side peak), that peak above the RSS before the
first step (what training adds to the built model; the libraries a process loaded cancel out) and above the RSS at
the end of the warm-up (with its CPU arena on, ORT keeps what the warm-up reserved, so this growth understates what
it holds: compare peaks); the process's peak RSS (export included), the GPU allocator's peak on CUDA, and the last loss
(configurations that must compute the same numbers show the same). Under the table, for each ORT-ZeRO3
configuration: the recompute ort_zero applied, from its run record (`ort_run_record(model)["training"]["recompute"]`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_report import merge_rounds, print_table

from ort_zero.tools.process_tree import free_port

CONFIGS = {
    "native-z3": ["--mode", "native", "--stage", "3"],
    "native-z3-ckpt": ["--mode", "native", "--stage", "3", "--gradient-checkpointing"],
    "torch-z3": ["--mode", "torch", "--stage", "3"],
    "ort-z3": ["--mode", "ort", "--stage", "3"],
    "ort-z3-l1": ["--mode", "ort", "--stage", "3"],
    "ort-z3-l2": ["--mode", "ort", "--stage", "3"],
    "native-z2": ["--mode", "native", "--stage", "2"],
    "ort-z2": ["--mode", "ort", "--stage", "2"],
    "ort-z2-memgrad": ["--mode", "ort", "--stage", "2", "--mem-grads"],
}
# ORTMODULE_MEMORY_OPT_LEVEL in the worker's environment; "0" for every other configuration, so that a value in the
# caller's environment cannot change what a configuration means.
MEMORY_OPT_LEVEL = {"ort-z3-l1": "1", "ort-z3-l2": "2"}
DEFAULT_CONFIGS = ["native-z3", "torch-z3", "ort-z3", "native-z2", "ort-z2", "ort-z2-memgrad"]
RECOMPUTE_CONFIGS = ["native-z3", "native-z3-ckpt", "ort-z3", "ort-z3-l1", "ort-z3-l2"]
FREED_AT_ONCE = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # large freed blocks go back to the OS: RSS follows live tensors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["gpt", "mlp"], default="gpt")
    parser.add_argument("--steps", type=int, default=20, help="measured steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--configs", nargs="*", choices=list(CONFIGS),
        help=f"default: {' '.join(DEFAULT_CONFIGS)}; with --sweep-gpt-depth: {' '.join(RECOMPUTE_CONFIGS)}",
    )  # fmt: skip
    parser.add_argument(
        "--baseline",
        choices=list(CONFIGS),
        help="ratios are to this one (default: native-z3-ckpt if run, else native-z3)",
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="run every configuration this many times, in turn")
    parser.add_argument("--profile", type=Path, help="also cProfile rank 0: writes PROFILE/<config>/rank0.pstats")
    parser.add_argument("--sweep-depth", type=int, nargs="*", help="the Linear stack at each of these depths")
    parser.add_argument("--sweep-gpt-depth", type=int, nargs="*", help="the GPT with each of these numbers of blocks")
    parser.add_argument("--seq-len", type=int, default=128, help="the GPT's sequence length")
    parser.add_argument("--micro-batch", type=int, default=4, help="micro-batch per rank")
    parser.add_argument(
        "--ort-arena",
        action="store_true",
        help="keep ORT's CPU arena in every session of the GPT sweep (ORT_ZERO_CPU_MEM_ARENA=1), where it is off by "
        "default (=0): it keeps its high-water mark, grown in powers of two, so RSS would show neither what a step "
        "needs nor what recompute saves",
    )
    args = parser.parse_args()
    if args.sweep_depth and args.sweep_gpt_depth:
        parser.error("--sweep-depth and --sweep-gpt-depth: one sweep per run")
    if args.configs is None:
        args.configs = RECOMPUTE_CONFIGS if args.sweep_gpt_depth else DEFAULT_CONFIGS
    if "native-z3-ckpt" in args.configs and (args.sweep_depth or args.model != "gpt"):
        parser.error("native-z3-ckpt checkpoints the GPT's blocks: use it with the GPT")
    if args.baseline is None:
        args.baseline = "native-z3-ckpt" if "native-z3-ckpt" in args.configs else "native-z3"

    batch = ["--micro-batch", str(args.micro_batch)]
    gpt = ["--model", "gpt", "--seq-len", str(args.seq_len), *batch]
    gpt_title = f"seq {args.seq_len}, micro-batch {args.micro_batch}"
    if args.sweep_depth:
        for depth in args.sweep_depth:
            rows = run_configs(args, ["--model", "stack", "--depth", str(depth), *batch], FREED_AT_ONCE)
            print_table(f"stack of {depth} x Linear(2048)", rows, args)
    elif args.sweep_gpt_depth:
        env = {**FREED_AT_ONCE, "ORT_ZERO_CPU_MEM_ARENA": "1" if args.ort_arena else "0"}
        for n_layer in args.sweep_gpt_depth:
            rows = run_configs(args, [*gpt, "--n-layer", str(n_layer)], env)
            print_table(f"GPT {n_layer} x 256, {gpt_title}", rows, args)
    elif args.model == "gpt":
        print_table(f"GPT 4 x 256, {gpt_title}", run_configs(args, gpt, {}), args)
    else:
        print_table(f"model {args.model}", run_configs(args, ["--model", args.model, *batch], {}), args)
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
                run_env["ORTMODULE_MEMORY_OPT_LEVEL"] = MEMORY_OPT_LEVEL.get(name, "0")
                result = subprocess.run(command, capture_output=True, text=True, env=run_env, timeout=1800)
                if result.returncode != 0:
                    raise SystemExit(f"{name}: FAILED\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
                runs[name].append([json.loads((out / f"rank{r}.json").read_text()) for r in range(args.nproc)])
                print(f"[bench] round {round_index + 1}/{args.rounds}: {name} done", file=sys.stderr, flush=True)
    return [(name, merge_rounds(rounds)) for name, rounds in runs.items()]


if __name__ == "__main__":
    sys.exit(main())
