"""Every line an ORT run prints is one the user needs: the same 2-rank job prints what native DeepSpeed prints, for
ort_zero's GPT example and for an ordinary Hugging Face Trainer script (ORTZeroTrainer against transformers.Trainer).

Lines are compared rank by rank (torchrun's `--tee` writes each rank's output to its own files, so two ranks writing
at once cannot cut each other's lines) and by kind (digits and spacing removed: times, losses and progress differ
between runs); each line a rank prints in the ORT run must be one the same rank prints natively, or ort_zero's own
(`ort_zero: ...`), and there are no more of them. Before ort_zero's console fixes (torch 2.14) the ORT run printed
65 lines against native's 29: ORT's feature table, its deep-copy warning and captured export log, CUDA notes on a CPU
machine, C++ notes from every rank.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "ort_zero" / "examples"
JOBS = {  # example -> (its options, how it says native and ORT)
    "train_gpt": (
        ["--deepspeed_config", str(ROOT / "ds_configs" / "zero3_cpu_fp32.json"), "--steps", "3", "--seq-len", "32"]
        + ["--d-model", "64", "--n-layer", "2", "--n-head", "4"],
        (["--native"], ["--ort"]),
    ),
    "train_hf": (
        ["--deepspeed", str(ROOT / "ds_configs" / "zero3_hf_auto.json"), "--max-steps", "3", "--model-type", "llama"],
        (["--no-ort"], []),  # ORT is its default
    ),
}


PROGRESS_BAR = re.compile(r"train:[^\]]*\]")  # the example's tqdm bar, redrawn in place and cut by other output
# Numbers whole, with their decimals and exponent: the Trainer prints a metric as '374' in one run, '26.75' in another.
NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


# DeepSpeed 0.19.8 calls collectives that torch 2.14 deprecates, and torch warns (two lines) at calls, natively too,
# unless ort_zero keeps them out (the examples' init_distributed does): their number follows the number of
# collectives, which an ORT run may differ in (its exports).
PER_COLLECTIVE = ("instead.", "return func(*args, **kwargs)")


def kinds_of_lines(output: str) -> list[str]:
    """Each printed line without progress bars, numbers and runs of spaces; lines that held only a bar go."""
    lines = [PROGRESS_BAR.sub("", line) for line in output.splitlines()]
    kinds = [re.sub(r"\s+", " ", NUMBER.sub("", line)).strip() for line in lines]
    return [kind for kind in kinds if kind]


def run(example: str, mode: list[str], out: Path) -> list[list[str]]:
    """The kinds of lines each rank printed (stdout, then stderr), in rank order."""
    argv = [*JOBS[example][0], *mode, "--output-dir", str(out)]
    logs = out.parent / f"{out.name}_logs"
    options = ("--tee=3", f"--log-dir={logs}")
    launch = torchrun_cmd(EXAMPLES / f"{example}.py", argv, port=free_port(), nproc=2, options=options)
    run_launcher(launch, timeout=400, cwd=ROOT)
    ranks = sorted({path.parent for path in logs.rglob("stdout.log")}, key=lambda folder: int(folder.name))
    assert len(ranks) == 2, ranks
    return [kinds_of_lines((r / "stdout.log").read_text() + (r / "stderr.log").read_text()) for r in ranks]


@pytest.mark.parametrize(
    "example", [pytest.param(job, marks=[] if job == "train_hf" else pytest.mark.extended) for job in sorted(JOBS)]
)
def test_an_ort_run_prints_what_a_native_run_prints(tmp_path: Path, example: str) -> None:
    native_mode, ort_mode = JOBS[example][1]
    native_ranks = run(example, native_mode, tmp_path / "native")
    ort_ranks = run(example, ort_mode, tmp_path / "ort")
    assert (tmp_path / "ort" / "ort.json").is_file()
    for rank, (native, ort) in enumerate(zip(native_ranks, ort_ranks, strict=True)):
        unexpected = [line for line in ort if line not in native and not line.startswith("ort_zero:")]
        assert unexpected == [], f"rank {rank}:\n" + "\n".join(unexpected)
        counted = [[line for line in lines if not line.endswith(PER_COLLECTIVE)] for lines in (native, ort)]
        assert len(counted[1]) <= len(counted[0]), (rank, len(counted[1]), len(counted[0]))
