"""Attention and experts as torch's kernels in ORT's graph under the layer-wise recompute (ORTMODULE_MEMORY_OPT_LEVEL
=1): a dense (Qwen3, sdpa) and a mixture-of-experts family (Qwen3-MoE, sdpa and transformers' default grouped_mm
experts), tiny from config, train in ORT under ZeRO-3 with transformers.Trainer's per-step losses (native DeepSpeed,
within 1e-5), 2 CPU ranks under torchrun, and every layer's attention and experts PythonOp runs again in the
backward (the run record counts the copies). The families test holds level 0 (test_model_families.py)."""

from __future__ import annotations

import json
from pathlib import Path

from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "train_families.py"
LAYERS = 2  # ort_zero.examples.train_hf's default for a tiny model
ATTENTION = "ort_zero.ort.step.torch_kernels.attention.ScaledDotProductAttention"
EXPERTS = "ort_zero.ort.step.torch_kernels.experts.ExpertsInTorch"


def test_attention_and_experts_recomputed_at_level_1_train_as_native(tmp_path: Path) -> None:
    argv = ["--out", str(tmp_path), "--families", "qwen3,qwen3_moe", "--attn", "default", "--steps", "3"]
    env = {"ORTMODULE_MEMORY_OPT_LEVEL": "1", "OMP_NUM_THREADS": "1"}
    run_launcher(torchrun_cmd(SCRIPT, argv, port=free_port()), timeout=600, cwd=ROOT, env=env)
    runs = json.loads((tmp_path / "families.json").read_text())
    for family, kernels in (("qwen3", {ATTENTION: LAYERS}), ("qwen3_moe", {ATTENTION: LAYERS, EXPERTS: LAYERS})):
        native, ort = runs[f"{family}/default/native"], runs[f"{family}/default/ort"]
        recompute = ort["ort"]["recompute"]
        assert recompute["level"] == 1 and len(recompute["layers"]) == LAYERS, recompute
        copies = recompute["recomputed_python_ops"]
        assert {name: copies.get(name, 0) for name in kernels} == kernels, copies
        diffs = [abs(a - b) for a, b in zip(native["losses"], ort["losses"], strict=True)]
        assert len(diffs) == 3 and max(diffs) <= 1e-5, (family, native["losses"], ort["losses"])
