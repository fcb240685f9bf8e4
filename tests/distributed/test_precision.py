"""bf16 ZeRO-3 in ONNX Runtime against native DeepSpeed bf16, on 2 CPU ranks (DeepSpeed's CPU accelerator).

Tolerance: every step's loss within one bf16 unit in the last place of native's (bf16 keeps 8 significant bits: 2^-7
to 2^-8 relative, 0.016 at a loss of 3).
Both runs compute the same bf16 model, but not through the same roundings: torch rounds every elementwise op's
result to bf16, while in ORT the ops the CPU provider runs only in float32 (Add, Mul, the fused RMSNorm and SiLU,
their gradients) compute a fused chain in float32 and round once, so the runs part by rounding differences, not by
a different computation. The fp32 parity tests keep their own 1e-5.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from launcher import free_port, run_launcher, torchrun_cmd
from parity import assert_ran_in_ort, train

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "ort_zero" / "examples" / "train_hf.py"
TRAINER_STEPS = 8


def bf16_ulp(value: float) -> float:
    """The gap between `value` (as bf16 rounds it) and the next bf16 number away from zero."""
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7)


def assert_within_bf16_rounding(reference: list[float], result: list[float]) -> None:
    assert len(result) == len(reference)
    for step, (expected, got) in enumerate(zip(reference, result, strict=True)):
        assert abs(got - expected) <= bf16_ulp(expected), f"step {step}: ORT {got} vs native {expected}"
    for losses in (reference, result):
        assert losses[-1] < losses[0] - 0.05, f"a run did not learn, the test proves nothing: {losses}"


def test_bf16_plain_loop_follows_native_and_keeps_zero3s_dtypes(tmp_path: Path) -> None:
    """The plain DeepSpeed loop with `"bf16": {"enabled": true}`: ORT's losses follow native's, the parameters,
    their partitions and the gradients DeepSpeed's hooks receive are bf16 and its master weights fp32 on both paths,
    and the nodes ORT's CPU provider cannot run in bf16 computed in float32 (none of the model silently in fp32)."""
    native = train(tmp_path / "native", "native", "base", "--precision", "bf16", model="gpt")
    ort = train(tmp_path / "ort", "ort", "base", "--precision", "bf16", model="gpt")
    assert_ran_in_ort(ort)
    assert_within_bf16_rounding(native["losses"], ort["losses"])
    expected = {"params": ["torch.bfloat16"], "partitions": ["torch.bfloat16"], "masters": ["torch.float32"]}
    for result in (native, ort):
        assert {key: result["dtypes"][key] for key in expected} == expected, result["dtypes"]
        assert result["dtypes"]["grads"] == ["torch.bfloat16"], result["dtypes"]


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
    follows native bf16, and its graphs compute in float32 only the ops the provider has no bf16 kernel for."""
    common = ["--model-type", "llama", "--precision", "bf16", "--max-steps", str(TRAINER_STEPS)]
    common += ["--gradient-checkpointing", "--gradient-accumulation-steps", "2"]
    native = trainer(tmp_path / "native", *common, "--no-ort")
    ort = trainer(tmp_path / "ort", *common)
    assert_within_bf16_rounding(native["losses"], ort["losses"])
    training = ort["ort"]["training"]
    assert training["session"] and ort["ort"]["inference"]["session"]
    assert training["recompute"]["level"] == 1 and training["recompute"]["recomputed_nodes"] > 0
    fallbacks = training["float32_fallbacks"]
    assert {"Add", "Mul", "SimplifiedLayerNormalization", "SimplifiedLayerNormalizationGrad"} <= set(fallbacks)
    assert "Cast" not in fallbacks and "Reshape" not in fallbacks, fallbacks  # ops with bf16 kernels stay bf16
