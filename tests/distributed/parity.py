"""Shared by the parity tests: train the toy models on 2 CPU ranks and compare two runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd

SCRIPT = Path(__file__).parent / "scripts" / "run_zero3.py"
STEPS = 20
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}


def train(out: Path, mode: str, variant: str, *extra: str, model: str = "zoo") -> dict:
    args = ["--mode", mode, "--model", model, "--variant", variant, "--steps", str(STEPS), "--out", str(out), *extra]
    run_launcher(torchrun_cmd(SCRIPT, args, nproc=2, port=free_port()), timeout=300, cwd=SCRIPT.parent)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(len(r["losses"]) == STEPS for r in ranks)
    return ranks[0]


def assert_same_training(reference: dict, result: dict, rtol: float, atol: float) -> None:
    for step, (expected, got) in enumerate(zip(reference["losses"], result["losses"], strict=True)):
        assert got == pytest.approx(expected, rel=rtol, abs=atol), f"loss differs at step {step}"
    for key in ("eval_loss", "eval_mode_loss"):
        assert result[key] == pytest.approx(reference[key], rel=rtol, abs=atol), key
    assert set(result["params"]) == set(reference["params"])
    for name, expected in reference["params"].items():
        got = result["params"][name]
        max_abs = max(abs(a - b) for a, b in zip(expected, got, strict=True))
        # Per tensor, relative to its norm: Adam normalises each update, so float32 rounding differences in
        # near-zero gradient entries show up elementwise at ~1e-6 even when the tensors agree to 1e-6 overall.
        norm = math.sqrt(sum(a * a for a in expected)) or 1.0
        relative = math.sqrt(sum((a - b) ** 2 for a, b in zip(expected, got, strict=True))) / norm
        assert max_abs <= atol or relative <= rtol, (
            f"parameter {name}: max |diff| {max_abs:.3g}, relative {relative:.3g}"
        )
    assert reference["losses"][-1] < reference["losses"][0], "the reference run did not learn: the test proves nothing"
