"""`ort-zero converge`: the same model, seed and data with PyTorch-ZeRO3 and ORT-ZeRO3; do the curves agree?

"PyTorch" is ort_zero's ZeRO-3 hooks in plain PyTorch (train_gpt `--no-ort`), "ORT" the same hooks with the model in
ORTModule (`--ort`). Checks the DeepSpeed config first, then runs `ort_zero.examples.train_gpt` twice under torchrun
(N local ranks, 127.0.0.1 rendezvous), then writes `report.md` (per-step losses, max difference, time per step,
first divergence) and `losses.png`, and exits 1 when the curves differ beyond tolerance, 2 when the config is
unusable or a run fails. A run past `--timeout` is stopped with its ranks.

`--memory-opt-level N` (default: ORTMODULE_MEMORY_OPT_LEVEL from the environment, else 0) sets
ORTMODULE_MEMORY_OPT_LEVEL for the ORT run only, so the curves show whether ort_zero's layer-wise recompute changes
training; the report says which recompute plans the ORT run applied (its `ort.json`, `training.recompute`), and says
so plainly when none did.

`--precision bf16` (or `fp16`, dynamic loss scaling) turns on that section of the DeepSpeed config for both runs (the
config the runs used is written beside the report). The loss of a 16-bit model is a 16-bit number, and the two runs
round the same math at different places, so the default tolerance is two units in the last place of that type at
its coarsest (2^-6 relative in bf16, 2^-9 in fp16; 1e-4 in fp32); the report states it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import IO

from ort_zero import configs, settings
from ort_zero.cli.curves import SPREAD_FACTOR, Curve, Verdict, compare, read_curve, within_own_spread
from ort_zero.examples.config import ConfigError, load_and_check
from ort_zero.tools import record_comparison, record_report
from ort_zero.tools.process_tree import TaggedProcessTree, free_port
from ort_zero.tools.recompute_summary import describe_recompute, recompute_applied

DEFAULT_CONFIG = "zero3_cpu_fp32.json"  # shipped with ort_zero (`configs`)
STOP_GRACE_S = 10.0  # after SIGTERM, before SIGKILL
PRECISION_SECTIONS = {
    "fp32": {},
    "bf16": {"bf16": {"enabled": True}},
    "fp16": {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}},
}
# Two units in the last place at the type's coarsest relative spacing (2^-7 for bf16's 8 bits, 2^-10 for fp16's 11)
DEFAULT_RTOL = {"fp32": 1e-4, "bf16": 2**-6, "fp16": 2**-9}
MEMORY_OPT_ENV = "ORTMODULE_MEMORY_OPT_LEVEL"
DIVERGENCE_HINT = (
    "- if the curves agree to float precision for many steps and then jump: Adam with a tiny `eps` turns last-bit "
    "differences in near-zero gradients into lr-sized updates (see ds_configs/README.md); compare with `eps` 1e-6, or "
    "find the first differing activation with `ort-zero compare` on statistics dumps"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", type=int, default=2, help="ranks on this machine")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--deepspeed_config",
        type=configs.resolve,
        default=DEFAULT_CONFIG,
        help="DeepSpeed JSON config (a file, or the name of one ort_zero ships; `ort-zero configs` lists them)",
    )
    parser.add_argument("--output-dir", type=Path, default=Path("runs/converge"))
    parser.add_argument(
        "--precision", choices=list(PRECISION_SECTIONS), default="fp32", help="the config's bf16/fp16 section on"
    )
    parser.add_argument(
        "--rtol", type=float, default=None, help="relative loss tolerance per step (default: by --precision)"
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument(
        "--memory-opt-level",
        type=int,
        choices=settings.RECOMPUTE_LEVELS,
        help=f"{MEMORY_OPT_ENV} for the ORT run (1: recompute each transformer layer, 2: and the other modules); "
        f"default: {MEMORY_OPT_ENV} from the environment, else 0",
    )
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="extra arguments for train_gpt (after --)")


def run(args: argparse.Namespace) -> int:
    try:
        load_and_check(args.deepspeed_config, world_size=args.nproc, ort_zero_enabled=True)
        if args.memory_opt_level is None:
            args.memory_opt_level = settings.recompute_level()  # the variable's value, checked
    except (ConfigError, ValueError) as error:
        print(f"ort-zero converge: {error}", file=sys.stderr)
        return 2
    args.output_dir.mkdir(parents=True, exist_ok=True)
    if args.rtol is None:
        args.rtol = DEFAULT_RTOL[args.precision]
    args.run_config = with_precision(args.deepspeed_config, args.precision, args.output_dir)
    curves: dict[str, Curve] = {}
    for name, flag, threads in runs(args.precision):
        run_dir = args.output_dir / name
        print(f"[converge] {name}: {args.nproc} ranks, {args.steps} steps -> {run_dir}", flush=True)
        failure = _train(args, flag, run_dir, threads)
        if failure:
            print(f"[converge] {name} run failed: {failure}", file=sys.stderr)
            return 2
        curves[name] = read_curve(run_dir / "losses.csv")
    verdict = compare(curves["pytorch"], curves["ort"], args.rtol)
    if REORDERED in curves:
        torch_curve, ort_curve, reordered = curves["pytorch"], curves["ort"], curves[REORDERED]
        verdict = within_own_spread(
            verdict, torch_curve, ort_curve, reordered, args.rtol, args.precision, other_thread_count()
        )
    recompute = recompute_line(args.memory_opt_level, args.output_dir / "ort" / "ort.json")
    parting = records_line(args.output_dir)
    report = args.output_dir / "report.md"
    report.write_text(render_report(curves, verdict, args, recompute, parting))
    plot(curves, args.output_dir / "losses.png")
    print(f"[converge] {recompute}")
    print(parting)
    print(verdict.summary)
    print(f"[converge] report: {report}")
    return 0 if verdict.agree else 1


REORDERED = "pytorch_reordered"
RECORD_DIR = "record"  # each run's record (integrations.run_record), compared as `ort-zero compare` does


def records_line(output_dir: Path) -> str:
    """Where the two runs' records first part beyond their precision's tolerance (the step, phase and layer);
    `ort-zero compare`'s report of them is written beside converge's, as `records.md` and `records.png`."""
    try:
        a, b = (record_comparison.load(output_dir / name / RECORD_DIR) for name in ("pytorch", "ort"))
        comparison = record_comparison.compare(a, b)
    except record_comparison.RecordError as error:
        return f"[converge] records: not compared ({error})"
    record_report.write(comparison, output_dir / "records.md")
    return record_report.verdict_line(comparison).replace("[compare]", "[converge] records:")


def runs(precision: str) -> list[tuple[str, str, int | None]]:
    """The runs: name, train_gpt's flag, and OMP_NUM_THREADS when not the launcher's. In 16 bits PyTorch runs a
    second time with another number of threads, which sums in another order: how far PyTorch parts from itself."""
    both = [("pytorch", "--no-ort", None), ("ort", "--ort", None)]
    return both if precision == "fp32" else [*both, (REORDERED, "--no-ort", other_thread_count())]


def other_thread_count() -> int:
    """Another number of threads than the runs have (torchrun's default is one per rank)."""
    return 2 if os.environ.get("OMP_NUM_THREADS", "1") == "1" else 1


def _train(args: argparse.Namespace, flag: str, run_dir: Path, threads: int | None = None) -> str | None:
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        "-m", "ort_zero.examples.train_gpt", flag,
        "--deepspeed_config", str(args.run_config), "--steps", str(args.steps),
        "--seq-len", str(args.seq_len), "--seed", str(args.seed), "--output-dir", str(run_dir),
        "--record", str(run_dir / RECORD_DIR),
        *[a for a in args.train_args if a != "--"],
    ]  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "launcher.log"
    with open(log_path, "w") as log:
        env = run_environment(args, flag) | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
        returncode = launch(command, env, log, args.timeout)
    if returncode is None:
        return f"no result within {args.timeout:.0f}s, stopped (see {log_path})"
    if returncode != 0:
        return f"exit code {returncode} (see {log_path})"
    return None


def with_precision(config: Path, precision: str, output_dir: Path) -> Path:
    """The config the runs use: `config` as it is in fp32, else a copy with the precision's section on."""
    if precision == "fp32":
        return config
    merged = {**json.loads(config.read_text()), **PRECISION_SECTIONS[precision]}
    for other in set(PRECISION_SECTIONS) - {precision, "fp32"}:
        merged.pop(other, None)
    written = output_dir / f"{config.stem}_{precision}.json"
    written.write_text(json.dumps(merged, indent=2) + "\n")
    return written


def run_environment(args: argparse.Namespace, flag: str) -> dict[str, str]:
    """The launcher's environment: the ORT run gets the memory-optimization level, the PyTorch run none (it has no
    ORT graph to optimize), so that the report's "PyTorch" is always training without recompute."""
    # TORCH_WARM_POOL=0: DeepSpeed imports torch.compile, whose worker pool can outlive a rank and stall launchers.
    env = dict(os.environ, ORTMODULE_FALLBACK_POLICY="FALLBACK_DISABLE", TORCH_WARM_POOL="0")
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.pop(MEMORY_OPT_ENV, None)
    if flag == "--ort":
        env[MEMORY_OPT_ENV] = str(args.memory_opt_level)
    return env


def recompute_line(level: int, ort_json: Path) -> str:
    """The report's line on the ORT run's recompute, from its ort.json (`training.recompute`); a level above 0 with
    nothing recomputed is a warning."""
    if ort_json.is_file():
        record = json.loads(ort_json.read_text())["training"].get("recompute")
        described, applied = describe_recompute(record), recompute_applied(record)
    else:
        described, applied = f"unknown ({ort_json} is missing)", False
    what = f"ORT run at {MEMORY_OPT_ENV}={level}, recompute: {described}"
    if level > 0 and not applied:
        return f"WARNING: {what}; these curves do not test recompute"
    return what


def launch(command: list[str], env: dict[str, str], log: IO[str], timeout: float) -> int | None:
    """Run `command` with its output in `log`; its exit code, or None when it ran past `timeout` and was stopped.
    Whatever it leaves running (ranks in sessions of their own included) is stopped before this returns."""
    with TaggedProcessTree(command, stdout=log, env=env, grace_s=STOP_GRACE_S) as tree:
        return tree.wait(timeout)


def tolerance_said(args: argparse.Namespace) -> str:
    """The report's words for the tolerance: its value, and where it is the 16-bit default, what it is."""
    said = f"relative tolerance {args.rtol:g}"
    if args.precision != "fp32" and args.rtol == DEFAULT_RTOL[args.precision]:
        said += f": two {args.precision} units in the last place"
    return said


def render_report(
    curves: dict[str, Curve], verdict: Verdict, args: argparse.Namespace, recompute: str, parting: str
) -> str:
    torch_curve, ort_curve, reordered = curves["pytorch"], curves["ort"], curves.get(REORDERED)
    median = {name: sorted(c.times_ms)[len(c.times_ms) // 2] for name, c in curves.items()}
    lines = [
        "# ort_zero convergence: PyTorch-ZeRO3 vs ORT-ZeRO3",
        "",
        "PyTorch: ort_zero's ZeRO-3 hooks with the model in plain PyTorch (train_gpt `--no-ort`); "
        "ORT: the same hooks with the model in ORTModule (`--ort`). Same model, seed and data.",
        "",
        f"- ranks: {args.nproc}, steps: {args.steps}, seq len: {args.seq_len}, seed: {args.seed}",
        f"- DeepSpeed config: `{args.deepspeed_config}`; precision: {args.precision}"
        + (f" (the runs' config: `{args.run_config}`)" if args.precision != "fp32" else ""),
        f"- {recompute}",
        f"- verdict: **{'agree' if verdict.agree else 'diverge'}** ({tolerance_said(args)})",
        f"- max |loss difference|: {verdict.max_abs_diff:.3g}; max relative: {verdict.max_rel_diff:.3g}",
        f"- first step beyond tolerance: {verdict.first_divergence if verdict.first_divergence is not None else '-'}",
        f"- {parting.removeprefix('[converge] ')} (step by step, layer by layer: [records.md](records.md))",
        *([] if reordered is None else [spread_said(args.precision), f"- {verdict.summary.split('] ', 1)[1]}"]),
        *([] if verdict.agree else [DIVERGENCE_HINT]),
        f"- median step time: PyTorch {median['pytorch']:.1f} ms, ORT {median['ort']:.1f} ms",
        "",
        "| step | PyTorch loss | ORT loss | difference | PyTorch ms | ORT ms |"
        + (" PyTorch, reordered | its difference |" if reordered else ""),
        "|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if reordered else ""),
    ]
    for i, step in enumerate(torch_curve.steps):
        a, b = torch_curve.losses[i], ort_curve.losses[i]
        row = f"| {step} | {a:.6f} | {b:.6f} | {abs(a - b):.2e} | {torch_curve.times_ms[i]:.1f} | "
        row += f"{ort_curve.times_ms[i]:.1f} |"
        if reordered is not None:
            row += f" {reordered.losses[i]:.6f} | {abs(a - reordered.losses[i]):.2e} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def spread_said(precision: str) -> str:
    """The report's line on the 16-bit verdict's second test."""
    return (
        f"- {precision}'s own spread: PyTorch again with OMP_NUM_THREADS={other_thread_count()} (another reduction "
        f"order; `{REORDERED}`). {precision} rounding, amplified by the optimizer, parts two correct runs; ORT beyond "
        f"the tolerance still agrees while each step's difference is at most {SPREAD_FACTOR:g}x the largest that "
        "run has shown from PyTorch by that step"
    )


def plot(curves: dict[str, Curve], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axis = pyplot.subplots(figsize=(7, 4))
    for (name, curve), style in zip(curves.items(), ("-", "--", ":"), strict=False):
        axis.plot(curve.steps, curve.losses, style, label=f"{name}-ZeRO3")
    axis.set_xlabel("step")
    axis.set_ylabel("loss")
    axis.set_title("ort_zero: PyTorch vs ORT under DeepSpeed ZeRO-3")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
