"""Every line an ORT run prints is one the user needs: the same 2-rank job prints what native DeepSpeed prints.

Lines are compared by kind (digits and spacing removed: times, losses and progress differ between runs); each line
of the ORT run must be one the native run prints, or ort_zero's own (`ort_zero: ...`), and there are no more of
them. Before ort_zero's console fixes (torch 2.14) the ORT run printed 65 lines against native's 29: ORT's feature
table, its deep-copy warning and captured export log, CUDA notes on a CPU machine, C++ notes from every rank.
"""

from __future__ import annotations

import re
from pathlib import Path

from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "ort_zero" / "examples" / "train_gpt.py"
SMALL = ["--seq-len", "32", "--d-model", "64", "--n-layer", "2", "--n-head", "4", "--steps", "3"]


PROGRESS_BAR = re.compile(r"train:[^\]]*\]")  # the example's tqdm bar, redrawn in place and cut by other output


def kinds_of_lines(output: str) -> list[str]:
    """Each printed line without progress bars, digits and runs of spaces; lines that held only a bar go."""
    lines = [PROGRESS_BAR.sub("", line) for line in output.splitlines()]
    kinds = [re.sub(r"\s+", " ", re.sub(r"[0-9]+", "", line)).strip() for line in lines]
    return [kind for kind in kinds if kind]


def run(mode: str, out: Path) -> list[str]:
    argv = [
        f"--{mode}",
        "--deepspeed_config",
        str(ROOT / "ds_configs" / "zero3_cpu_fp32.json"),
        "--output-dir",
        str(out),
    ]
    result = run_launcher(torchrun_cmd(TRAINER, [*argv, *SMALL], port=free_port(), nproc=2), timeout=400, cwd=ROOT)
    return kinds_of_lines(result.stdout)


def test_an_ort_run_prints_what_a_native_run_prints(tmp_path: Path) -> None:
    native = run("native", tmp_path / "native")
    ort = run("ort", tmp_path / "ort")
    assert (tmp_path / "ort" / "ort.json").is_file()
    unexpected = [line for line in ort if line not in native and not line.startswith("ort_zero:")]
    assert unexpected == [], "\n".join(unexpected)
    assert len(ort) <= len(native), (len(ort), len(native))
