"""The checks transformers and accelerate run on their own DeepSpeed integration (GPU-gated there), rebuilt for
ORTZeroTrainer on 2 CPU ranks: each job of scripts/trainer_checks.py (the example's job with one thing changed) is
trained by transformers.Trainer under native DeepSpeed ZeRO-3 and by ORTZeroTrainer in the same launch, and the two
agree step by step, in the weights they save and in what the Trainer reports.

Jobs: the four optimizer/scheduler combinations (DeepSpeed's or the Trainer's each), optimizer and parameter CPU
offload, `evaluate()`/`predict()` in ORT, `load_best_model_at_end`, LoRA with non-reentrant gradient checkpointing
(also on ort_zero's hooks in PyTorch), and DeepSpeed's `zero_to_fp32` / `load_state_dict_from_zero_checkpoint` on an
ORT run's checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "trainer_checks.py"
TOLERANCE = 1e-5
LEARNING_RATE = 2e-3  # the example's default
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}
COMBINATIONS = ["ds_optimizer+ds_scheduler", "ds_optimizer+hf_scheduler", "hf_optimizer+ds_scheduler"]
COMBINATIONS += ["hf_optimizer+hf_scheduler"]


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Every job in one 2-rank torchrun launch (the suite pays the start-up once)."""
    out = tmp_path_factory.mktemp("trainer_checks")
    run_launcher(torchrun_cmd(SCRIPT, ["--out", str(out)], port=free_port()), timeout=900, cwd=ROOT)
    return out, json.loads((out / "checks.json").read_text())


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(next(folder.glob("*.safetensors")))


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), set(a) ^ set(b)
    return max((a[name].float() - b[name].float()).abs().max().item() for name in a)


def assert_same_job(out: Path, runs: dict, job: str, mode: str = "ort") -> None:
    """The run in `mode` trained like the native one: losses, learning rates, eval loss and saved weights."""
    native, other = runs[f"{job}/native"], runs[f"{job}/{mode}"]
    if mode == "ort":
        assert other["ort"]["training"]["session"], "no ORT training session"
        assert BRIDGES <= set(other["ort"]["training"]["python_ops"]), other["ort"]["training"]
    assert not native["hooks"] and other["hooks"], "the native run was on ort_zero's hooks, or the other was not"
    assert len(other["losses"]) == len(native["losses"]) > 1
    assert other["losses"] == pytest.approx(native["losses"], abs=TOLERANCE)
    assert other["learning_rates"] == pytest.approx(native["learning_rates"], abs=1e-12)
    assert other["eval_loss"] == pytest.approx(native["eval_loss"], abs=TOLERANCE)
    difference = max_difference(weights(out / job / "native" / "model"), weights(out / job / mode / "model"))
    assert difference <= TOLERANCE, f"{job}: saved weights differ by {difference:.3g}"


@pytest.mark.parametrize("job", COMBINATIONS)
def test_optimizer_and_scheduler_combination_in_ort_follows_native(checks: tuple[Path, dict], job: str) -> None:
    """DeepSpeed's optimizer/scheduler where the config has one, the Trainer's where it does not; the run took the
    schedule it was given (the Trainer's: linear decay from the learning rate; DeepSpeed's WarmupDecayLR: another)."""
    out, runs = checks
    optimizer, scheduler = (part.split("_")[0] for part in job.split("+"))
    config = json.loads((out / job / "ds_config.json").read_text())
    assert ("optimizer" in config) == (optimizer == "ds") and ("scheduler" in config) == (scheduler == "ds")
    assert_same_job(out, runs, job)
    rates = runs[f"{job}/ort"]["learning_rates"]
    linear = [LEARNING_RATE * (1 - step / len(rates)) for step in range(len(rates) + 1)]
    # the rate logged is the step's, or the next step's where DeepSpeed's engine steps the Trainer's scheduler
    is_linear = rates == pytest.approx(linear[:-1]) or rates == pytest.approx(linear[1:])
    assert is_linear == (scheduler == "hf"), rates


def test_cpu_offload_of_optimizer_and_parameters_in_ort_follows_native(checks: tuple[Path, dict]) -> None:
    out, runs = checks
    for mode in ("native", "ort"):
        assert runs[f"cpu_offload/{mode}"]["offload"] == {"optimizer": "cpu", "param": "cpu"}
    assert_same_job(out, runs, "cpu_offload")


def test_evaluate_and_predict_run_in_ort_with_natives_results(checks: tuple[Path, dict]) -> None:
    """After training, `evaluate()` and `predict()` run the model in ORT's inference session; predict's logits and
    loss equal native's."""
    out, runs = checks
    job = "ds_optimizer+hf_scheduler"
    inference = runs[f"{job}/ort"]["ort"]["inference"]
    assert inference["session"] and BRIDGES <= set(inference["python_ops"]), inference
    native, ort = (torch.load(out / job / mode / "predictions.pt") for mode in ("native", "ort"))
    assert ort["logits"].shape == native["logits"].shape and ort["logits"].shape[0] == 16, ort["logits"].shape
    assert (ort["logits"] - native["logits"]).abs().max().item() <= 1e-4
    assert ort["metrics"]["test_loss"] == pytest.approx(native["metrics"]["test_loss"], abs=TOLERANCE)
    assert ort["metrics"]["test_loss"] == pytest.approx(runs[f"{job}/ort"]["eval_loss"], abs=TOLERANCE)


def test_load_best_model_at_end_in_ort_loads_the_best_checkpoint(checks: tuple[Path, dict]) -> None:
    """With eval_loss and greater_is_better=True the best checkpoint is the first (the loss falls): after training
    both Trainers hold checkpoint-2's weights, not the last step's, and evaluate them in ORT to the best metric."""
    out, runs = checks
    assert_same_job(out, runs, "best_model")
    for mode in ("native", "ort"):
        run = runs[f"best_model/{mode}"]
        assert Path(run["best_model_checkpoint"]).name == "checkpoint-2", run["best_model_checkpoint"]
        assert run["eval_loss"] == pytest.approx(run["best_metric"], abs=TOLERANCE)
    folder = out / "best_model" / "ort"
    final = weights(folder / "model")
    assert max_difference(final, weights(folder / "checkpoint-2")) <= TOLERANCE
    assert max_difference(final, weights(folder / "checkpoint-6")) > 100 * TOLERANCE, "the last step's weights"


def test_lora_with_non_reentrant_checkpointing_trains_and_saves_real_adapters(checks: tuple[Path, dict]) -> None:
    """LoRA under ZeRO-3 with non-reentrant activation checkpointing (transformers #47254, DeepSpeed #8148): on
    ort_zero's hooks in PyTorch (Hugging Face's checkpoints) and in ORT (ort_zero's recompute) as natively; the
    saved adapters have their real shapes (peft #1328), equal to native's."""
    out, runs = checks
    assert_same_job(out, runs, "lora_checkpointing", mode="hooks")
    assert_same_job(out, runs, "lora_checkpointing", mode="ort")
    assert runs["lora_checkpointing/native"]["hf_gradient_checkpointing"]
    assert runs["lora_checkpointing/hooks"]["hf_gradient_checkpointing"]
    recompute = runs["lora_checkpointing/ort"]["ort"]["training"]["recompute"]
    assert recompute["level"] == 1 and recompute["recomputed_nodes"] > 0, recompute
    adapters = weights(out / "lora_checkpointing" / "ort" / "model")
    assert adapters and all("lora_" in name for name in adapters), list(adapters)
    for name, tensor in adapters.items():
        rank_dim = 0 if "lora_A" in name else 1
        assert tensor.dim() == 2 and tensor.shape[rank_dim] == 4 and tensor.numel() > 4, (name, tensor.shape)


CONSOLIDATE = """
import json, subprocess, sys
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM
from deepspeed.utils.zero_to_fp32 import load_state_dict_from_zero_checkpoint
checkpoint, out = sys.argv[1], sys.argv[2]
subprocess.run([sys.executable, f"{checkpoint}/zero_to_fp32.py", checkpoint, out, "--safe_serialization"], check=True)
model = load_state_dict_from_zero_checkpoint(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(checkpoint)),
                                             checkpoint)
saved = load_file(f"{checkpoint}/model.safetensors")
converted = load_file(f"{out}/model.safetensors")
loaded = model.state_dict()
def difference(other):
    return {"names": sorted(set(saved) ^ set(other)),
            "max": max((saved[n] - other[n]).abs().max().item() for n in saved if n in other)}
print(json.dumps({"zero_to_fp32": difference(converted), "load_state_dict": difference(loaded)}))
"""


def test_zero_to_fp32_and_load_state_dict_from_zero_checkpoint_read_an_ort_checkpoint(
    checks: tuple[Path, dict], tmp_path: Path
) -> None:
    """DeepSpeed's consolidation of the ORT run's ZeRO-3 shards (the checkpoint's own zero_to_fp32.py, and
    load_state_dict_from_zero_checkpoint into a model from config) gives the weights the Trainer saved with it."""
    out, _ = checks
    checkpoint = out / "best_model" / "ort" / "checkpoint-6"
    command = [sys.executable, "-c", CONSOLIDATE, str(checkpoint), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for way in ("zero_to_fp32", "load_state_dict"):
        assert result[way]["names"] == [] and result[way]["max"] <= 1e-7, (way, result[way])
