"""The headline benchmark: native DeepSpeed ZeRO-3 (`transformers.Trainer`) vs ORT-ZeRO3 (`ORTZeroTrainer`) on a
Hugging Face causal LM at the sizes people train, side by side in one run.

    .venv/bin/python benchmarks/bench_real_size.py                          # ~160M and ~400M, 30 and 10 steps
    .venv/bin/python benchmarks/bench_real_size.py --sizes 160m --steps 30 --png runs/rss.png
    .venv/bin/python benchmarks/bench_real_size.py --sizes 160m --steps 12 --rounds 4   # step ratio per round
    .venv/bin/python benchmarks/bench_real_size.py --sizes 160m --seq 1024 --gradient-checkpointing --steps 6
    .venv/bin/python benchmarks/bench_real_size.py --sizes moe90m moe400m --seq 512
    .venv/bin/python benchmarks/bench_real_size.py --sizes 160m --seq 1024 --precision bf16 --trimmed-native

Each dense size is a LLaMA config from `AutoModelForCausalLM.from_config` (vocab 32000, the default attention
implementation), each `moe` size a Qwen3-MoE (every layer experts, transformers' default experts implementation);
`--seq` (default 128) and `--gradient-checkpointing` (natively torch's checkpoints, under ORT the layer-wise
recompute) set the shape. AdamW from `ds_configs/zero3_hf_auto.json`, micro-batch 1, random token ids, 2 ranks under
torchrun (OMP_NUM_THREADS=1 each on CPU), everything else as users run it (ORT's CPU arena on). The worker is an
ordinary Trainer script (`real_size_worker.py`). Per size and rank: the first step (export and session included,
with ORT's phases), the median step from step 3 and the CPU it took (user, system, and the time off the CPU:
waiting for the other rank or for the machine), the peak RSS, RSS after steps 1, 3 and the last, how far RSS
moved from step 3 to the last, and the same for the live heap (what malloc handed out and did not get back: a leak
shows there, glibc keeping freed pages does not), the pages faulted in per step (on CPU, memory handed back to the
OS costs its page faults again when it is used next); losses and grad norms checked equal. A PNG shows RSS over
time for both. With `--rounds N` the two modes run N times in turn and the step ratio is reported per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from ort_zero.tools.process_tree import TaggedProcessTree, free_port

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "real_size_worker.py"
SIZES = {  # name: (hidden, layers, heads, intermediate (per expert), experts, top-k, default steps)
    "160m": (768, 12, 12, 3072, 0, 0, 30),
    "400m": (1024, 24, 16, 3072, 0, 0, 10),
    "moe90m": (512, 4, 8, 512, 16, 4, 10),  # OLMoE/Qwen3-MoE-shaped, 87M
    "moe400m": (768, 6, 12, 384, 64, 8, 6),  # 64 experts, top-8
}
MODES = ("native", "ort")
# native DeepSpeed with glibc returning freed heap pages as ort_zero's trims do: the allocator held equal
TRIMMED = "native_trimmed"


def run_mode(
    size: str,
    mode: str,
    steps: int,
    out: Path,
    timeout: float,
    seq: int = 128,
    checkpointing: bool = False,
    precision: str = "fp32",
) -> list[dict[str, Any]]:
    hidden, layers, heads, intermediate, experts, top_k, _ = SIZES[size]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"}
    env.setdefault("DS_ACCELERATOR", "cpu")
    if mode == TRIMMED:
        env["MALLOC_TRIM_THRESHOLD_"] = "0"  # glibc gives freed pages back at every free
        out = out / TRIMMED
    worker_mode = "native" if mode == TRIMMED else mode
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
        f"--master_port={free_port()}", str(WORKER), "--mode", worker_mode, "--hidden", str(hidden),
        "--layers", str(layers), "--heads", str(heads), "--intermediate", str(intermediate), "--steps", str(steps),
        "--deepspeed", str(ROOT / "ds_configs" / "zero3_hf_auto.json"), "--out", str(out), "--seq-len", str(seq),
        "--experts", str(experts), "--top-k", str(top_k), "--precision", precision,
    ] + (["--activation-checkpointing"] if checkpointing else [])  # fmt: skip
    log = out / f"{worker_mode}.log"
    out.mkdir(parents=True, exist_ok=True)
    with log.open("w") as sink, TaggedProcessTree(command, stdout=sink, env=env) as launch:
        code = launch.wait(timeout)  # leaving the block stops the launcher and its ranks
    if code != 0:
        outcome = "timed out" if code is None else f"exit {code}"
        raise SystemExit(f"bench_real_size: {size} {mode} failed ({outcome}); see {log}")
    return [json.loads((out / f"{worker_mode}-rank{rank}.json").read_text()) for rank in range(2)]


def summary(rank: dict[str, Any]) -> dict[str, float]:
    steps = rank["steps"]
    rss = [step["rss_mib"] for step in steps]
    live = [step["malloced_mib"] for step in steps]
    return {
        "first_step_s": steps[0]["seconds"],
        "median_step_s": statistics.median(step["seconds"] for step in steps[2:]),
        "peak_rss_mib": rank["peak_rss_mib"],
        "rss_step1_mib": rss[0],
        "rss_step3_mib": rss[min(2, len(rss) - 1)],
        "rss_last_mib": rss[-1],
        "rss_drift_pct": 100 * (rss[-1] - rss[min(2, len(rss) - 1)]) / rss[min(2, len(rss) - 1)],
        "live_last_mib": live[-1],
        "live_drift_pct": 100 * (live[-1] - live[min(2, len(live) - 1)]) / live[min(2, len(live) - 1)],
        "faults_k": statistics.median(step["minor_faults"] for step in steps[2:]) / 1000,
        **{
            f"{phase}_faults_k": statistics.median(step["faults_by_phase"][phase] for step in steps[2:]) / 1000
            for phase in ("forward", "backward", "optimizer")
        },
        "user_s": statistics.median(step["user_s"] for step in steps[2:]),
        "sys_s": statistics.median(step["sys_s"] for step in steps[2:]),
        "off_cpu_s": statistics.median(step["seconds"] - step["user_s"] - step["sys_s"] for step in steps[2:]),
    }


ROWS = [
    ("first step (s)", "first_step_s", "{:.1f}"),
    ("median step from step 3 (s)", "median_step_s", "{:.2f}"),
    ("of it CPU in the process, user (s, median)", "user_s", "{:.2f}"),
    ("of it CPU in the kernel for the process, system (s, median)", "sys_s", "{:.2f}"),
    ("of it off the CPU: waiting for the other rank or the machine (s, median)", "off_cpu_s", "{:.2f}"),
    ("peak RSS (MiB)", "peak_rss_mib", "{:.0f}"),
    ("RSS after step 1 (MiB)", "rss_step1_mib", "{:.0f}"),
    ("RSS after step 3 (MiB)", "rss_step3_mib", "{:.0f}"),
    ("RSS after the last step (MiB)", "rss_last_mib", "{:.0f}"),
    ("RSS from step 3 to the last (%)", "rss_drift_pct", "{:+.1f}"),
    ("live heap after the last step (MiB)", "live_last_mib", "{:.0f}"),
    ("live heap from step 3 to the last (%)", "live_drift_pct", "{:+.1f}"),
    ("pages faulted in per step from step 3 (thousands, median)", "faults_k", "{:.0f}"),
    ("of them in the forward (thousands, median)", "forward_faults_k", "{:.0f}"),
    ("of them in the backward (thousands, median)", "backward_faults_k", "{:.0f}"),
    ("of them in the optimizer step (thousands, median)", "optimizer_faults_k", "{:.0f}"),
]


def table(size: str, runs: dict[str, list[dict[str, Any]]]) -> str:
    native, ort = ([summary(rank) for rank in runs[mode]] for mode in MODES)
    first = runs["native"][0]
    shape = f"{first.get('precision', 'fp32')}, seq {first.get('seq_len', 128)}"
    shape += ", checkpointing" if first.get("activation_checkpointing") else ""
    experts = f", experts {first['experts_implementation']}" if first.get("experts_implementation") else ""
    lines = [
        f"### {size}: {first['parameters'] / 1e6:.1f}M parameters, {shape}, {len(first['steps'])} steps, "
        f"attention {first['attn_implementation']}{experts}",
        "",
        "| per rank (0 / 1) | native ZeRO-3 | ORT-ZeRO3 | ORT / native |",
        "|---|---:|---:|---:|",
    ]
    for label, key, fmt in ROWS:
        cells = [" / ".join(fmt.format(rank[key]) for rank in side) for side in (native, ort)]
        ratio = "" if key.endswith("_drift_pct") else " / ".join(
            f"{o[key] / n[key]:.2f}x" for n, o in zip(native, ort, strict=True)
        )  # fmt: skip
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
    if TRIMMED in runs:  # the allocator held equal: native with glibc's trims beside ORT
        trimmed = [summary(rank) for rank in runs[TRIMMED]]
        for label, key in (
            ("peak RSS, native with MALLOC_TRIM_THRESHOLD_=0 (MiB)", "peak_rss_mib"),
            ("median step, native with MALLOC_TRIM_THRESHOLD_=0 (s)", "median_step_s"),
        ):
            cell = " / ".join(f"{rank[key]:.{0 if 'rss' in key else 2}f}" for rank in trimmed)
            ratio = " / ".join(f"{o[key] / t[key]:.2f}x" for t, o in zip(trimmed, ort, strict=True))
            lines.append(f"| {label} | {cell} | | ORT / trimmed native {ratio} |")
    losses = [[step["loss"] for step in runs[mode][0]["steps"]] for mode in MODES]
    norms = [[step["grad_norm"] for step in runs[mode][0]["steps"]] for mode in MODES]
    loss_gap = max(abs(a - b) for a, b in zip(*losses, strict=True))
    norm_gap = max(abs(a - b) / abs(a) for a, b in zip(*norms, strict=True))
    lines += [
        "",
        f"Losses: {', '.join(f'{loss:.4f}' for loss in losses[0][:3])} ...; largest difference {loss_gap:.1e} "
        f"(Trainer logs 4 decimals), grad norms within {norm_gap:.1e} relative.",
        "ORT's first step, rank 0 (s): "
        + ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in runs["ort"][0]["ort_phases"].items()),
    ]
    return "\n".join(lines)


def rounds_line(rounds: list[dict[str, list[dict[str, Any]]]]) -> str:
    """Median step per round of both modes, rank 0: one run proves little where the machine's speed moves by 10%.
    The user CPU per step beside it moves far less: it is the work each mode does, without the machine's waits."""

    def ratios_of(key: str) -> tuple[dict[str, list[float]], list[float]]:
        medians = {mode: [summary(runs[mode][0])[key] for runs in rounds] for mode in MODES}
        return medians, [ort / native for native, ort in zip(medians["native"], medians["ort"], strict=True)]

    steps, step_ratios = ratios_of("median_step_s")
    _, user_ratios = ratios_of("user_s")
    return (
        f"{len(rounds)} rounds, the order swapped every round: median step native "
        f"{', '.join(f'{s:.2f}' for s in steps['native'])} s, ORT {', '.join(f'{s:.2f}' for s in steps['ort'])} s; "
        f"ORT / native {', '.join(f'{r:.2f}x' for r in step_ratios)} (median {statistics.median(step_ratios):.2f}x); "
        f"user CPU per step ORT / native {', '.join(f'{r:.2f}x' for r in user_ratios)} "
        f"(median {statistics.median(user_ratios):.2f}x)."
    )


def plot(results: dict[str, dict[str, list[dict[str, Any]]]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for axis, (size, runs) in zip(axes[0], results.items(), strict=True):
        for mode, color in zip(MODES, ("tab:blue", "tab:red"), strict=True):
            for rank in runs[mode]:
                seconds, mib = zip(*rank["rss_samples"], strict=True)
                style = "-" if rank["rank"] == 0 else ":"
                axis.plot(seconds, [m / 1024 for m in mib], style, color=color, label=f"{mode} rank {rank['rank']}")
        axis.set(title=f"{size}: RSS per rank", xlabel="seconds since start", ylabel="GiB")
        axis.legend()
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--steps", type=int, default=None, help="per size; default 30 at 160m, 10 at 400m")
    parser.add_argument("--seq", type=int, default=128, help="sequence length")
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="activation checkpointing (ORT: layer-wise recompute)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_real_size")
    parser.add_argument("--png", type=Path, default=None, help="default <out>/rss.png")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--rounds", type=int, default=1, help="native and ORT in turn, the order swapped each round")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="TrainingArguments(bf16=...)")
    parser.add_argument(
        "--trimmed-native",
        action="store_true",
        help="also native with MALLOC_TRIM_THRESHOLD_=0 (glibc hands freed pages back, as ort_zero's trims do)",
    )
    args = parser.parse_args()
    modes = (*MODES, TRIMMED) if args.trimmed_native else MODES
    results = {}
    for size in args.sizes:
        steps = args.steps or SIZES[size][-1]
        rounds = []
        for round_index in range(args.rounds):
            order = modes if round_index % 2 == 0 else modes[::-1]
            out = args.out / size / f"round{round_index + 1}" if args.rounds > 1 else args.out / size
            rounds.append(
                {
                    mode: run_mode(
                        size, mode, steps, out, args.timeout, args.seq, args.gradient_checkpointing, args.precision
                    )
                    for mode in order
                }
            )
        results[size] = rounds[0]
        print(table(size, results[size]), flush=True)
        if args.rounds > 1:
            print(rounds_line(rounds), flush=True)
        print(flush=True)
    png = args.png or args.out / "rss.png"
    plot(results, png)
    print(f"RSS over time: {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
