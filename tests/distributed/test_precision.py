"""bf16 (and fp16) ZeRO-3 in ONNX Runtime against native DeepSpeed, on 2 CPU ranks (DeepSpeed's CPU accelerator).

Tolerance: every step's loss within two units in the last place of native's, in the 16-bit type (bf16 keeps 8
significant bits: an ulp is 2^-7 to 2^-8 relative, 0.016 at a loss of 3; fp16 11 bits, 0.002 at 3): each run's loss
is itself rounded to that type (half an ulp each, where the model computes its loss in it), and the two runs round
the same math at different places.
Both runs compute the same bf16 model, but not through the same roundings: torch rounds every elementwise op's
result to bf16, while in ORT the ops the CPU provider runs only in float32 (Add, Mul, the fused RMSNorm and SiLU,
their gradients) compute a fused chain in float32 and round once, so the runs part by rounding differences, not by
a different computation (measured: at most 1 ulp in bf16 and 2 in fp16 over 20 steps of the small GPT, 4e-5
relative on the Trainer's LLaMA, whose loss is computed in fp32). The fp32 parity tests keep their 1e-5.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd
from parity import assert_ran_in_ort, train, ulp

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "ort_zero" / "examples" / "train_hf.py"
TRAINER_STEPS = 8

TORCH_DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def assert_within_rounding(reference: list[float], result: list[float], precision: str = "bf16") -> None:
    assert len(result) == len(reference)
    for step, (expected, got) in enumerate(zip(reference, result, strict=True)):
        assert abs(got - expected) <= 2 * ulp(expected, precision), f"step {step}: ORT {got} vs native {expected}"
    for losses in (reference, result):
        assert losses[-1] < losses[0] - 0.05, f"a run did not learn, the test proves nothing: {losses}"


@pytest.mark.parametrize("precision", ["bf16", pytest.param("fp16", marks=pytest.mark.extended)])
def test_plain_loop_follows_native_and_keeps_zero3s_dtypes(tmp_path: Path, precision: str) -> None:
    """The plain DeepSpeed loop with `"bf16"` (or `"fp16"`, dynamic loss scaling) `{"enabled": true}`: ORT's
    losses follow native's; the parameters, their partitions and the gradients DeepSpeed's hooks receive are 16-bit
    and its master weights fp32 on both paths; in fp16 both skip the same overflowing steps on every rank."""
    native = train(tmp_path / "native", "native", "base", "--precision", precision, model="gpt")
    ort = train(tmp_path / "ort", "ort", "base", "--precision", precision, model="gpt")
    assert_ran_in_ort(ort)
    assert_within_rounding(native["losses"], ort["losses"], precision)
    half = [TORCH_DTYPE[precision]]
    expected = {"params": half, "partitions": half, "masters": ["torch.float32"], "grads": half}
    for result in (native, ort):
        assert result["dtypes"] == expected, result["dtypes"]
    if precision == "fp16":
        skipped = {
            (mode, rank["skipped_steps"]) for mode, run in (("native", native), ("ort", ort)) for rank in run["ranks"]
        }
        assert skipped == {("native", native["skipped_steps"]), ("ort", native["skipped_steps"])}, skipped
        assert native["skipped_steps"] > 0, "no step overflowed: the loss scaler's skip was not exercised"


KERNELS = "ort_zero.ort.step.torch_kernels.elementwise"  # the PythonOps of the MLP's SiLU and product in torch
NORMS = "ort_zero.ort.step.torch_kernels.norms"  # and of the RMSNorms


def trainer(out: Path, *options: str) -> dict:
    argv = ["--deepspeed", str(ROOT / "ds_configs" / "zero3_hf_auto.json"), "--output-dir", str(out), *options]
    run_launcher(torchrun_cmd(TRAINER, argv, port=free_port()), timeout=400, cwd=ROOT)
    with (out / "losses.csv").open(newline="") as handle:
        losses = [float(row["loss"]) for row in csv.DictReader(handle)]
    ort = out / "ort.json"
    return {"losses": losses, "ort": json.loads(ort.read_text()) if ort.exists() else None}


def test_bf16_trainer_with_recompute_and_accumulation_follows_native(tmp_path: Path) -> None:
    """`TrainingArguments(bf16=True)` with the config's `"bf16": {"enabled": "auto"}`, gradient checkpointing (in
    ORT the layer-wise recompute) and 2 micro-batches per step: LLaMA (RMSNorm, rotary, SwiGLU, sdpa) in ORT
    follows native bf16, and its graphs compute in float32 only the ops the provider has no bf16 kernel for and torch's
    kernels do not replace (the MLP's activation and product, the sums and the norms run in torch, in bf16)."""
    common = ["--model-type", "llama", "--precision", "bf16", "--max-steps", str(TRAINER_STEPS)]
    common += ["--gradient-checkpointing", "--gradient-accumulation-steps", "2"]
    native = trainer(tmp_path / "native", *common, "--no-ort")
    ort = trainer(tmp_path / "ort", *common)
    assert_within_rounding(native["losses"], ort["losses"])
    training = ort["ort"]["training"]
    assert training["session"] and ort["ort"]["inference"]["session"]
    assert training["recompute"]["level"] == 1 and training["recompute"]["recomputed_nodes"] > 0
    fallbacks = training["float32_fallbacks"]
    assert "Cast" not in fallbacks and "Reshape" not in fallbacks, fallbacks  # ops with bf16 kernels stay bf16
    in_torch = {f"{KERNELS}.{name}" for name in ("SiluInTorch", "ProductInTorch", "SumInTorch")}
    in_torch.add(f"{NORMS}.RmsNormInTorch")
    assert in_torch <= set(training["python_ops"])
    torchs = {"QuickGelu", "Mul", "Add", "SimplifiedLayerNormalization", "SimplifiedLayerNormalizationGrad"}
    assert not torchs & set(fallbacks), fallbacks  # torch's, in bf16
