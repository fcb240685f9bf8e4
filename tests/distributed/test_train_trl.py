"""TRL 1.16's trainers in ONNX Runtime under ZeRO-3 (ort_zero.integrations.trl), 2 CPU ranks under torchrun: each job
runs with TRL's trainer (native DeepSpeed) and with its ORT class on the same data (scripts/train_trl.py: a small LLaMA
from config, a word-level tokenizer trained in the script), and the per-step losses agree to 1e-5. SFT's loss comes
from TRL's `ChunkedLogProbFunction` (an autograd Function with None outputs, run as a PythonOp in ORT's graph); DPO
trains on preference pairs against a reference model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd
from parity import ulp

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "train_trl.py"
STEPS = 6
TOLERANCE = 1e-5
TIMEOUT = 300
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}
TRL_FUNCTION = "trl.kernels.chunked_logprob.ChunkedLogProbFunction.WithTensorOutputs"


def losses(out: Path) -> list[float]:
    with (out / "losses.csv").open(newline="") as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]


def native_and_ort(tmp_path: Path, trainer: str, *options: str) -> tuple[list[float], list[float]]:
    """The job with TRL's trainer and with ort_zero's; ORT's run record shows its training graph ran in an ORT
    session with the ZeRO-3 bridges and TRL's Function as PythonOps."""
    for mode in ("native", "ort"):
        argv = ["--trainer", trainer, "--out", str(tmp_path / mode), "--steps", str(STEPS), *options]
        argv += ["--ort"] if mode == "ort" else []
        run_launcher(torchrun_cmd(SCRIPT, argv, port=free_port()), timeout=TIMEOUT, cwd=ROOT)
    training = json.loads((tmp_path / "ort" / "ort.json").read_text())["training"]
    assert training["session"], "no ORT training session"
    assert {*BRIDGES, TRL_FUNCTION} <= set(training["python_ops"]), training["python_ops"]
    native, ort = losses(tmp_path / "native"), losses(tmp_path / "ort")
    assert len(native) == len(ort) == STEPS
    return native, ort


def assert_same_curve(native: list[float], ort: list[float], precision: str = "fp32") -> None:
    for step, (expected, got) in enumerate(zip(native, ort, strict=True)):
        tolerance = TOLERANCE if precision == "fp32" else 2 * ulp(expected, precision)  # test_precision.py: why
        assert abs(got - expected) <= tolerance, f"step {step}: ORT {got} vs native {expected}"
    assert len(set(native)) == STEPS, f"the losses do not move, the test proves nothing: {native}"


def test_sft_in_ort_follows_trl(tmp_path: Path) -> None:
    native, ort = native_and_ort(tmp_path, "sft")
    assert_same_curve(native, ort)
    assert native[-1] < native[0] - 0.1, f"SFT did not learn: {native}"


@pytest.mark.extended
@pytest.mark.parametrize("trainer", ["sft", "dpo"])
def test_lora_in_ort_follows_trl(tmp_path: Path, trainer: str) -> None:
    assert_same_curve(*native_and_ort(tmp_path, trainer, "--lora"))


@pytest.mark.extended
def test_sft_in_bf16_follows_trl_in_bf16(tmp_path: Path) -> None:
    native, ort = native_and_ort(tmp_path, "sft", "--bf16")
    assert_same_curve(native, ort, "bf16")
    assert json.loads((tmp_path / "ort" / "ort.json").read_text())["training"]["float32_fallbacks"]  # a bf16 graph
    assert native[-1] < native[0] - 0.1, f"SFT did not learn: {native}"


@pytest.mark.extended
def test_dpo_in_ort_follows_trl(tmp_path: Path) -> None:
    native, ort = native_and_ort(tmp_path, "dpo")
    assert_same_curve(native, ort)
    assert native[-1] < native[0] - 0.05, f"DPO did not learn: {native}"
