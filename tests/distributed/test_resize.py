"""A ZeRO-3 checkpoint resumed on another number of ranks (train_gpt, the plain DeepSpeed engine, and train_hf, the
Trainer): written by 2 ranks and resumed on 1, or by 1 and resumed on 2, with the same global batch (1 rank
accumulates 2 micro-batches), through `ort-zero universal-checkpoint` and `--resume --universal`: the resumed run's
losses (and train_gpt's final weights) are the uninterrupted run's. Without the conversion the run stops in one line
that names it (DeepSpeed's own load refuses another world size with a traceback).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launcher import final_weights, free_port, logged_losses, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
TRAIN_GPT = ROOT / "ort_zero" / "examples" / "train_gpt.py"
CONFIG = ROOT / "ds_configs" / "zero3_cpu_fp32.json"
TRAIN_HF = ROOT / "ort_zero" / "examples" / "train_hf.py"
HF_CONFIG = ROOT / "ds_configs" / "zero3_hf_auto.json"
SMALL = ["--seq-len", "32", "--d-model", "64", "--n-layer", "2", "--n-head", "4", "--seed", "7"]
MODES = {"native": ["--native"], "ort": ["--ort"]}
STEPS, SAVED_AT = 8, 4
TOLERANCE = 1e-5
TIMEOUT = 400
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}


def config_for(ranks: int, folder: Path) -> Path:
    """The project's config with the global batch of 2 ranks: 1 rank accumulates two micro-batches."""
    config = json.loads(CONFIG.read_text())
    assert config.get("gradient_accumulation_steps", 1) == 1 and "train_batch_size" not in config
    config["gradient_accumulation_steps"] = 2 // ranks
    path = folder / f"ds_config_{ranks}.json"
    path.write_text(json.dumps(config))
    return path


def train(out: Path, mode: str, ranks: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["--deepspeed_config", str(config_for(ranks, out.parent)), *SMALL, *MODES[mode], "--output-dir", str(out)]
    command = torchrun_cmd(TRAIN_GPT, [*argv, *args], port=free_port(), nproc=ranks)
    return run_launcher(command, timeout=TIMEOUT, cwd=ROOT, check=check)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-rank run of every step, natively (the reference for both modes, as in test_train_gpt_native)."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    train(out, "native", 2, "--steps", str(STEPS), "--save-every", str(STEPS))
    return out


def resized(tmp_path: Path, mode: str, saved_on: int, resumed_on: int) -> Path:
    out = tmp_path / "run"
    train(out, mode, saved_on, "--steps", str(SAVED_AT), "--save-every", str(SAVED_AT))
    refused = train(out, mode, resumed_on, "--steps", str(STEPS), "--resume", check=False)
    expected = f"written by {saved_on} ranks and this run has {resumed_on}; convert it with `ort-zero universal-"
    assert refused.returncode != 0 and expected in refused.stdout, refused.stdout[-3000:]
    convert = [sys.executable, "-m", "ort_zero.cli.main", "universal-checkpoint", str(out / "checkpoints")]
    subprocess.run(convert, check=True, timeout=TIMEOUT, capture_output=True, text=True)
    assert (out / "checkpoints" / "latest_universal").read_text() == f"global_step{SAVED_AT}_universal"
    train(out, mode, resumed_on, "--steps", str(STEPS), "--save-every", str(STEPS), "--resume", "--universal")
    assert json.loads((out / "args.json").read_text())["world_size"] == resumed_on
    return out


def check_same_run(out: Path, reference: Path) -> None:
    assert len(logged_losses(out)) == STEPS
    assert logged_losses(out) == pytest.approx(logged_losses(reference), abs=TOLERANCE)
    resumed, straight = final_weights(out), final_weights(reference)
    assert set(resumed) == set(straight)
    assert max((resumed[name] - straight[name]).abs().max().item() for name in resumed) <= TOLERANCE


@pytest.mark.extended
def test_a_2_rank_checkpoint_resumes_on_1_rank_natively(tmp_path: Path, uninterrupted: Path) -> None:
    check_same_run(resized(tmp_path, "native", 2, 1), uninterrupted)


@pytest.mark.extended
@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2)])
def test_an_ort_checkpoint_resumes_on_another_number_of_ranks(
    tmp_path: Path, uninterrupted: Path, saved_on: int, resumed_on: int
) -> None:
    out = resized(tmp_path, "ort", saved_on, resumed_on)
    check_same_run(out, uninterrupted)
    training = json.loads((out / "ort.json").read_text())["training"]
    assert training["session"] and BRIDGES <= set(training["python_ops"]), training


@pytest.mark.extended
@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2)])
def test_an_ort_zero_trainer_checkpoint_resumes_on_another_number_of_ranks(
    tmp_path: Path, saved_on: int, resumed_on: int
) -> None:
    """train_hf (ORTZeroTrainer): the job's checkpoint-4 (its later ones removed), converted, resumes with
    `--resume --universal` on the other number of ranks onto the curve the job drew uninterrupted."""
    out = tmp_path / "run"

    def train_hf(ranks: int, *args: str) -> None:
        argv = ["--deepspeed", str(HF_CONFIG), "--max-steps", str(STEPS), "--output-dir", str(out), *args]
        argv += ["--gradient-accumulation-steps", str(2 // ranks)]
        run_launcher(torchrun_cmd(TRAIN_HF, argv, port=free_port(), nproc=ranks), timeout=TIMEOUT, cwd=ROOT)

    train_hf(saved_on, "--save-steps", str(SAVED_AT))
    uninterrupted = logged_losses(out)
    shutil.rmtree(out / f"checkpoint-{STEPS}")
    convert = [sys.executable, "-m", "ort_zero.cli.main", "universal-checkpoint", str(out / f"checkpoint-{SAVED_AT}")]
    subprocess.run(convert, check=True, timeout=TIMEOUT, capture_output=True, text=True)
    began = (out / "ort.json").stat().st_mtime_ns
    train_hf(resumed_on, "--resume", "--universal")
    assert json.loads((out / "result.json").read_text())["world_size"] == resumed_on
    assert len(logged_losses(out)) == STEPS
    assert logged_losses(out) == pytest.approx(uninterrupted, abs=TOLERANCE)
    assert (out / "ort.json").stat().st_mtime_ns != began
    assert json.loads((out / "ort.json").read_text())["training"]["session"], "the resumed run did not run in ORT"
