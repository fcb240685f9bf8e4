"""The Hugging Face Trainer in ONNX Runtime under ZeRO-3 (ort_zero.examples.train_hf), 2 CPU ranks.

Each job runs twice, with ORTZeroTrainer and with plain transformers.Trainer (--no-ort, native DeepSpeed), under
the three launchers; the per-step losses agree to 1e-5. Also: the model is partitioned as it is built (zero.Init),
LoRA trains only its adapters, `save_model()` gives a checkpoint that `from_pretrained` loads in a fresh process
without ORT or DeepSpeed, a run resumed from a checkpoint continues the curve, gradient checkpointing in ORT is
ort_zero's layer-wise recompute, and gradient accumulation in ORT follows PyTorch and one micro-batch of the
accumulated size.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from launcher import deepspeed_cmd, free_port, mpirun_cmd, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "ort_zero" / "examples" / "train_hf.py"
CONFIG = ROOT / "ds_configs" / "zero3_hf_auto.json"
STEPS = 16
SAVE_AT = 8
CONTINUED_STEPS = 4
TOLERANCE = 1e-5
TIMEOUT = 400
CHECKPOINTING_STEPS = 8
ACCUMULATION_STEPS = 4  # optimizer steps
MICRO_BATCH, ACCUMULATION = 2, 4
CHECKPOINTING_ANNOUNCEMENT = "ort_zero: gradient checkpointing runs in ONNX Runtime as ort_zero's layer-wise recompute"
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}
LAUNCHERS = {
    "torchrun": lambda argv: torchrun_cmd(TRAINER, argv, port=free_port()),
    "deepspeed": lambda argv: deepspeed_cmd(TRAINER, argv, port=free_port()),
    "mpirun": lambda argv: mpirun_cmd(TRAINER, argv),
}


def train(out: Path, *options: str, launcher: str = "torchrun", check: bool = True) -> subprocess.CompletedProcess:
    argv = ["--deepspeed", str(CONFIG), "--output-dir", str(out), *options]
    env = {"MASTER_PORT": str(free_port())} if launcher == "mpirun" else None
    return run_launcher(LAUNCHERS[launcher](argv), timeout=TIMEOUT, cwd=ROOT, env=env, check=check)


def losses(out: Path) -> list[float]:
    with (out / "losses.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == list(range(len(rows))), rows
    return [float(row["loss"]) for row in rows]


def record(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def weights(out: Path) -> dict:
    """The trained model as `save_model()` wrote it (full tensors, plain names)."""
    from safetensors.torch import load_file

    return load_file(out / "model" / "model.safetensors")


def assert_ran_in_ort(out: Path) -> None:
    """ort.json: the training and the evaluation graph ran in ORT sessions, with ort_zero's ZeRO-3 bridges."""
    evidence = record(out, "ort.json")
    for mode in ("training", "inference"):
        assert evidence[mode]["session"], f"no ORT {mode} session"
        assert BRIDGES <= set(evidence[mode]["python_ops"]), evidence[mode]


def assert_same_curve(reference: list[float], result: list[float]) -> None:
    assert len(result) == len(reference) == STEPS
    diffs = [abs(a - b) for a, b in zip(reference, result, strict=True)]
    assert max(diffs) <= TOLERANCE, f"max |loss diff| {max(diffs):.3g} at step {diffs.index(max(diffs))}"
    assert reference[-1] < reference[0] - 0.05, f"the PyTorch run did not learn, the test proves nothing: {reference}"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """LLaMA (rotary embeddings, RMSNorm, SwiGLU): ORT under deepspeed's launcher (a checkpoint at SAVE_AT), PyTorch
    under torchrun."""
    ort, torch_run = tmp_path_factory.mktemp("llama_ort"), tmp_path_factory.mktemp("llama_torch")
    common = ["--model-type", "llama", "--max-steps", str(STEPS)]
    train(ort, *common, "--save-steps", str(SAVE_AT), launcher="deepspeed")
    train(torch_run, *common, "--no-ort")
    return ort, torch_run


def test_llama_in_ort_follows_pytorch(llama: tuple[Path, Path]) -> None:
    ort, torch_run = llama
    assert_ran_in_ort(ort)
    for out in llama:  # each rank trained on its own batches: accelerate counted both ranks
        assert record(out, "result.json")["trainer_world_size"] == 2
    assert_same_curve(losses(torch_run), losses(ort))
    assert record(ort, "result.json")["eval_loss"] == pytest.approx(
        record(torch_run, "result.json")["eval_loss"], abs=TOLERANCE
    )


@pytest.mark.extended
def test_gpt2_in_ort_follows_pytorch(tmp_path: Path) -> None:
    """GPT-2 (learned positions, Conv1D, tied embeddings): ORT under mpirun, PyTorch under torchrun."""
    common = ["--model-type", "gpt2", "--max-steps", str(STEPS)]
    train(tmp_path / "ort", *common, launcher="mpirun")
    train(tmp_path / "torch", *common, "--no-ort")
    assert_ran_in_ort(tmp_path / "ort")
    assert record(tmp_path / "ort", "result.json")["trainer_world_size"] == 2  # mpirun's ranks, as accelerate sees
    assert_same_curve(losses(tmp_path / "torch"), losses(tmp_path / "ort"))


def test_model_is_partitioned_as_it_is_built(llama: tuple[Path, Path]) -> None:
    """TrainingArguments with a ZeRO-3 config make from_config build under deepspeed.zero.Init: no rank ever holds
    the full model, from the first parameter on."""
    for out in llama:
        built = record(out, "zero_init.json")
        assert built["params"] > 0 and built["partitioned"] == built["params"], built
        assert built["local_numel"] == 0 and built["full_numel"] > 10_000, built


@pytest.mark.extended
def test_lora_in_ort_follows_pytorch(tmp_path: Path) -> None:
    """PEFT LoRA on the partitioned LLaMA: only the adapters train, in ORT as in PyTorch; the saved adapter has
    PEFT's own parameter names."""
    common = ["--model-type", "llama", "--lora", "--learning-rate", "2e-2", "--max-steps", str(STEPS)]
    train(tmp_path / "ort", *common)
    train(tmp_path / "torch", *common, "--no-ort")
    assert_ran_in_ort(tmp_path / "ort")
    assert_same_curve(losses(tmp_path / "torch"), losses(tmp_path / "ort"))
    result = record(tmp_path / "ort", "result.json")
    assert 0 < result["trainable_numel"] < result["full_numel"] / 10, result
    from safetensors import safe_open

    with safe_open(tmp_path / "ort" / "model" / "adapter_model.safetensors", "pt") as saved:
        names = list(saved.keys())
    assert names and all(n.startswith("base_model.model.model.layers.") and "lora_" in n for n in names), names


LOAD_AND_EVALUATE = """
import json, sys
import torch
from transformers import AutoModelForCausalLM
from ort_zero.data import CorpusWindows
model, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
windows = CorpusWindows(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])).windows  # the held-out windows
with torch.no_grad():
    loss = model.eval()(input_ids=windows, labels=windows).loss.item()
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("deepspeed", "onnxruntime"))
print(json.dumps({"loss": loss, "info": {k: list(v) for k, v in info.items()}, "loaded": loaded}))
"""


def test_saved_model_loads_without_ort_or_deepspeed(llama: tuple[Path, Path]) -> None:
    """trainer.save_model() of the ORT run: plain parameter names, loadable by from_pretrained in a fresh process
    without ORT or DeepSpeed, with the trained model's loss on the held-out windows."""
    ort, _ = llama
    result, seq_len = record(ort, "result.json"), record(ort, "args.json")["seq_len"]
    held_out = [str(result["eval_seed"]), str(result["eval_windows"]), str(seq_len)]
    command = [sys.executable, "-c", LOAD_AND_EVALUATE, str(ort / "model"), *held_out]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["loaded"] == [], f"loading imported {loaded['loaded']}"
    assert not any(loaded["info"].values()), loaded["info"]  # no missing, unexpected or mismatched names
    trained = result["eval_loss"]  # the Trainer's evaluate() in ORT after training
    assert math.isfinite(trained) and loaded["loss"] == pytest.approx(trained, abs=TOLERANCE)


def test_saved_model_trains_on_from_pretrained(tmp_path: Path, llama: tuple[Path, Path]) -> None:
    """The ORT run's save_model() folder, loaded by from_pretrained under zero.Init (partitioned from the first
    parameter on), trains on in ORT as transformers.Trainer trains it natively, starting from the trained weights."""
    ort, _ = llama
    common = ["--init-from", str(ort / "model"), "--max-steps", str(CONTINUED_STEPS)]
    train(tmp_path / "ort", *common)
    train(tmp_path / "torch", *common, "--no-ort")
    assert_ran_in_ort(tmp_path / "ort")
    for run in ("ort", "torch"):
        built = record(tmp_path / run, "zero_init.json")
        assert built["partitioned"] == built["params"] > 0 and built["local_numel"] == 0, built
    continued, native = losses(tmp_path / "ort"), losses(tmp_path / "torch")
    assert max(abs(a - b) for a, b in zip(native, continued, strict=True)) <= TOLERANCE, (native, continued)
    assert continued[0] < losses(ort)[0] - 0.5, "the loaded model did not start from the trained weights"


def test_resumed_run_continues_the_curve(tmp_path: Path, llama: tuple[Path, Path]) -> None:
    """From the ORT run's checkpoint at SAVE_AT, a new ORT run (resume_from_checkpoint) trains the remaining steps
    on the same curve: weights, optimizer, scheduler, data order and RNG all came back. Its final weights and
    trainer state (steps, epoch, every logged loss, grad norm and learning rate) are the uninterrupted run's."""
    ort, _ = llama
    checkpoint = f"checkpoint-{SAVE_AT}"
    subprocess.run(["cp", "-r", str(ort / checkpoint), str(ort / "losses.csv"), str(tmp_path)], check=True)
    train(tmp_path, "--model-type", "llama", "--max-steps", str(STEPS), "--save-steps", str(SAVE_AT), "--resume")
    assert_ran_in_ort(tmp_path)
    assert losses(tmp_path)[SAVE_AT:] == pytest.approx(losses(ort)[SAVE_AT:], abs=TOLERANCE)
    assert record(tmp_path, "result.json")["steps"] == STEPS
    resumed, uninterrupted = weights(tmp_path), weights(ort)
    assert set(resumed) == set(uninterrupted)
    assert max((resumed[n] - uninterrupted[n]).abs().max().item() for n in resumed) <= TOLERANCE
    expected = trainer_state(ort / f"checkpoint-{STEPS}")
    assert trainer_state(tmp_path / f"checkpoint-{STEPS}") == pytest.approx(expected, abs=TOLERANCE)


def trainer_state(checkpoint: Path) -> dict:
    """What trainer_state.json says about the run, without wall-clock times: steps, epoch, the logged history."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    flat = {key: state[key] for key in ("global_step", "epoch", "max_steps")}
    for i, entry in enumerate(state["log_history"]):
        timed = ("runtime", "per_second", "total_flos")
        flat.update({f"{i}.{key}": value for key, value in entry.items() if not any(t in key for t in timed)})
    return flat


def test_gradient_checkpointing_in_ort_is_layer_wise_recompute(tmp_path: Path) -> None:
    """gradient_checkpointing=True: ORTZeroTrainer trains with ort_zero's layer-wise recompute of the decoder layers
    (announced once per rank; Hugging Face's checkpoint calls stay off) on the curve of transformers.Trainer with
    Hugging Face's checkpointing under native DeepSpeed."""
    common = ["--model-type", "llama", "--gradient-checkpointing", "--max-steps", str(CHECKPOINTING_STEPS)]
    done = train(tmp_path / "ort", *common)
    train(tmp_path / "torch", *common, "--no-ort")
    assert_ran_in_ort(tmp_path / "ort")
    reference, result = losses(tmp_path / "torch"), losses(tmp_path / "ort")
    assert len(result) == len(reference) == CHECKPOINTING_STEPS
    assert result == pytest.approx(reference, abs=TOLERANCE)
    assert reference[-1] < reference[0] - 0.05, f"the PyTorch run did not learn, the test proves nothing: {reference}"
    assert record(tmp_path / "torch", "result.json")["hf_gradient_checkpointing"], "PyTorch ran without checkpoints"
    assert not record(tmp_path / "ort", "result.json")["hf_gradient_checkpointing"], "HF's checkpoint calls were on"
    training = record(tmp_path / "ort", "ort.json")["training"]
    recompute = training.get("recompute") or {}
    assert recompute.get("level") == 1 and recompute.get("recomputed_nodes", 0) > 0, recompute
    assert training["cpu_mem_arena"] is False  # it would keep the recompute's high-water mark through the step
    layers = sorted(recompute["layers"])
    assert [path.rsplit(".", 2)[-2:] for path in layers] == [["layers", "0"], ["layers", "1"]], layers
    announced = [line for line in done.stdout.splitlines() if CHECKPOINTING_ANNOUNCEMENT in line]
    assert len(announced) == 2 and all("ORTMODULE_MEMORY_OPT_LEVEL=1" in line for line in announced), announced


@pytest.mark.extended
def test_gradient_accumulation_in_ort_follows_pytorch_and_one_large_batch(tmp_path: Path) -> None:
    """Micro-batch 2 x accumulation 4 per rank: ORTZeroTrainer's per-step losses and trained weights equal those of
    transformers.Trainer (native DeepSpeed) on the same job, and those of ORTZeroTrainer with one micro-batch of 8
    (the same 16 windows per step over both ranks)."""
    common = ["--model-type", "llama", "--max-steps", str(ACCUMULATION_STEPS)]
    accumulated = ["--batch-size", str(MICRO_BATCH), "--gradient-accumulation-steps", str(ACCUMULATION)]
    train(tmp_path / "ort", *common, *accumulated)
    train(tmp_path / "torch", *common, *accumulated, "--no-ort")
    train(tmp_path / "large", *common, "--batch-size", str(MICRO_BATCH * ACCUMULATION))
    for out in ("ort", "large"):
        assert_ran_in_ort(tmp_path / out)
    reference = losses(tmp_path / "torch")
    assert reference[-1] < reference[0] - 0.05, f"the PyTorch run did not learn, the test proves nothing: {reference}"
    trained = weights(tmp_path / "ort")
    for out in ("torch", "large"):
        other = losses(tmp_path / out)
        assert len(other) == ACCUMULATION_STEPS and losses(tmp_path / "ort") == pytest.approx(other, abs=TOLERANCE)
        expected = weights(tmp_path / out)
        assert set(trained) == set(expected)
        diffs = {name: (trained[name] - expected[name]).abs().max().item() for name in expected}
        assert max(diffs.values()) <= TOLERANCE, f"{out}: weights differ: {diffs}"


def test_a_config_that_contradicts_the_arguments_fails_with_the_trainers_own_message(tmp_path: Path) -> None:
    """A DeepSpeed config whose learning rate contradicts TrainingArguments' stops ORTZeroTrainer as it stops
    transformers.Trainer: with the Trainer's message naming the value, before any step."""
    config = json.loads(CONFIG.read_text())
    config["optimizer"]["params"]["lr"] = 0.1  # the example's --learning-rate is 2e-3
    contradicting = tmp_path / "contradicting.json"
    contradicting.write_text(json.dumps(config))
    expected = "- ds optimizer.params.lr=0.1 vs hf learning_rate=0.002"
    for trainer in ("ort", "native"):
        options = ["--deepspeed", str(contradicting), "--max-steps", "2"] + (
            ["--no-ort"] if trainer == "native" else []
        )
        result = train(tmp_path / trainer, *options, check=False)
        output = (result.stdout or "") + (result.stderr or "")
        assert result.returncode != 0, output[-3000:]
        assert "mismatch TrainingArguments values" in output and expected in output, output[-3000:]
        assert not (tmp_path / trainer / "losses.csv").exists() or len(losses(tmp_path / trainer)) == 0
