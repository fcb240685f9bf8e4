"""The README's Trainer recipe as a user writes it (ort_zero.examples.readme_trainer: `init_distributed()` first,
`use_cpu=True`, a model at its defaults built under zero.Init, ORTZeroTrainer, no shut-down at the end) runs on 2 CPU
ranks under torchrun, trains in ORT, exits 0, and prints none of the warnings ort_zero keeps out of runs."""

from __future__ import annotations

import json
from pathlib import Path

from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
QUIETED = ("is deprecated. Please use `torch.distributed.", "TracerWarning", "DeprecationWarning")


def test_the_readme_trainer_recipe_runs_on_cpu_and_exits_quietly(tmp_path: Path) -> None:
    argv = ["--output-dir", str(tmp_path), "--max-steps", "3"]
    command = torchrun_cmd("-m", ["ort_zero.examples.readme_trainer", *argv], port=free_port())
    done = run_launcher(command, timeout=300, cwd=ROOT)  # exit code 0, or the test fails with the output
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ort_session"], "no ORT session: the Trainer did not train in ORT"
    assert len(result["losses"]) == 3
    said = {phrase: done.stdout.count(phrase) for phrase in QUIETED}
    assert said == dict.fromkeys(QUIETED, 0), said
