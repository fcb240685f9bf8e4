"""A rank killed while a checkpoint is written (scripts/die_during_save.py: rank 1 dies half-way through its
optimizer shard of checkpoint-4, after rank 0 has gone as far as it can) leaves the previous checkpoint resumable
under ORT-ZeRO3: DeepSpeed's `latest` tag never names the half-written checkpoint, the Trainer's folder for it has no
Trainer state, and `--resume` (resume_from_checkpoint=True) continues from checkpoint-2 on the uninterrupted curve.

The job keeps no parameter persistent (`stage3_param_persistence_threshold` 0): then DeepSpeed's rank 0 has no
collective left in its save and, natively, writes `latest` naming the half-written tag (measured; ort_zero's
zero3/saving.py writes it after every rank's files).
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "ort_zero" / "examples" / "train_hf.py"
DIE_DURING_SAVE = Path(__file__).parent / "scripts" / "die_during_save.py"
CONFIG = ROOT / "ds_configs" / "zero3_hf_auto.json"
JOB = ["--max-steps", "6", "--save-steps", "2"]
TOLERANCE = 1e-5
TIMEOUT = 400


def config_without_persistent_parameters(tmp_path: Path) -> Path:
    config = json.loads(CONFIG.read_text())
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


def output(done: subprocess.CompletedProcess) -> str:
    return (done.stdout or "") + (done.stderr or "")


def losses(out: Path) -> list[float]:
    with (out / "losses.csv").open(newline="") as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]


def test_a_rank_killed_while_saving_leaves_the_previous_checkpoint_to_resume_from(tmp_path: Path) -> None:
    config = config_without_persistent_parameters(tmp_path)
    out, reference = tmp_path / "ort", tmp_path / "uninterrupted"

    def launch(script: Path, folder: Path, *options: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = ["--deepspeed", str(config), "--output-dir", str(folder), *JOB, *options]
        return run_launcher(torchrun_cmd(script, argv, port=free_port()), timeout=TIMEOUT, cwd=ROOT, check=check)

    died = launch(DIE_DURING_SAVE, out, check=False)
    assert died.returncode != 0 and "die_during_save: rank 1 exits with 17" in output(died), output(died)[-3000:]
    cut, previous = out / "checkpoint-4", out / "checkpoint-2"
    half_written = cut / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    whole = previous / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    assert 0 < half_written.stat().st_size < whole.stat().st_size, "rank 1 did not die half-way through its shard"
    assert not (cut / "latest").exists(), "DeepSpeed's latest names the half-written checkpoint"
    assert not (cut / "trainer_state.json").exists(), "the cut checkpoint looks complete to the Trainer"
    assert (previous / "latest").read_text() == "global_step2" and (previous / "trainer_state.json").is_file()

    resumed = launch(TRAINER, out, "--resume")
    assert "checkpoint-4 incomplete (no trainer_state.json" in output(resumed)
    assert "resuming from checkpoint-2" in output(resumed)
    launch(TRAINER, reference, "--no-ort")
    assert len(losses(out)) == len(losses(reference)) == 6
    assert losses(out) == pytest.approx(losses(reference), abs=TOLERANCE)
    assert json.loads((out / "result.json").read_text())["steps"] == 6
    evidence = json.loads((out / "ort.json").read_text())
    assert evidence["training"]["session"], "the resumed run did not train in ORT"
    assert (cut / "trainer_state.json").is_file() and (cut / "latest").read_text() == "global_step4"
