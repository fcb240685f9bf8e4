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
MEMORY_EFFICIENT_LINEAR = "deepspeed.runtime.zero.linear.LinearFunctionForZeroStage3"
BACKWARD_PARAMS = "ort_zero.zero3.ort_bridges.BackwardParamsBridge"


MANTISSA_BITS = {"bf16": 7, "fp16": 10}


def ulp(value: float, precision: str = "bf16") -> float:
    """The gap between `value` (as `precision` rounds it) and the next number of that type away from zero: the
    half-precision tests' tolerances are counted in it (tests/distributed/test_precision.py says why)."""
    return 2.0 ** (math.floor(math.log2(abs(value))) - MANTISSA_BITS[precision])


def train(
    out: Path, mode: str, variant: str, *extra: str, model: str = "zoo", nproc: int = 2, env: dict | None = None
) -> dict:
    """Run scripts/run_zero3.py on `nproc` ranks; rank 0's record, with every rank's under "ranks"."""
    args = ["--mode", mode, "--model", model, "--variant", variant, "--steps", str(STEPS), "--out", str(out), *extra]
    command = torchrun_cmd(SCRIPT, args, nproc=nproc, port=free_port())
    run_launcher(command, timeout=300, cwd=SCRIPT.parent, env=env)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    assert all(len(r["losses"]) == STEPS for r in ranks)
    return {**ranks[0], "ranks": ranks}


def assert_ran_in_ort(result: dict, training_ops: frozenset[str] = frozenset()) -> None:
    """On every rank: ORT sessions ran the training and the inference graph; under ZeRO-3 both graphs hold
    ort_zero's bridges as PythonOps and ORT runs Linear layers itself (no DeepSpeed memory-efficient linear), and
    the training graph's backward reads parameters re-gathered for it, never the forward's copies; the training
    graph also holds `training_ops`."""
    for rank, evidence in enumerate(result["ranks"]):
        assert evidence["ort_session"] and evidence["inference_session"], f"rank {rank}: no ORT session ran"
        zero3 = evidence["ort_zero_hooks"]
        both = BRIDGES if zero3 else set()
        training = both | set(training_ops) | ({BACKWARD_PARAMS} if zero3 else set())
        for graph, wanted in (("python_ops", training), ("inference_python_ops", both)):
            assert wanted <= set(evidence[graph]), f"rank {rank}: {graph} lacks {wanted - set(evidence[graph])}"
            if zero3:
                assert MEMORY_EFFICIENT_LINEAR not in evidence[graph], f"rank {rank}: {graph} runs Linear in PyTorch"
        kept = evidence["backward_reads_of_forward_gathers"]
        assert not kept, f"rank {rank}: the backward reads parameters gathered in the forward: {kept}"


def assert_same_training(
    reference: dict, result: dict, rtol: float, atol: float, params_rtol: float | None = None
) -> None:
    """Per-step and eval losses within rtol/atol; parameters within `params_rtol` (default: rtol) or atol."""
    for step, (expected, got) in enumerate(zip(reference["losses"], result["losses"], strict=True)):
        assert got == pytest.approx(expected, rel=rtol, abs=atol), f"loss differs at step {step}"
    for key in ("eval_loss", "eval_mode_loss"):
        assert result[key] == pytest.approx(reference[key], rel=rtol, abs=atol), key
    assert_same_params(reference["params"], result["params"], params_rtol or rtol, atol)
    assert reference["losses"][-1] < reference["losses"][0], "the reference run did not learn: the test proves nothing"


def assert_same_params(
    reference: dict[str, list[float]], result: dict[str, list[float]], rtol: float, atol: float
) -> None:
    """Flattened parameters by name: each tensor within `atol` elementwise or `rtol` relative to its norm."""
    assert set(result) == set(reference)
    for name, expected in reference.items():
        got = result[name]
        max_abs = max(abs(a - b) for a, b in zip(expected, got, strict=True))
        # Per tensor, relative to its norm: Adam normalises each update, so float32 rounding differences in
        # near-zero gradient entries show up elementwise at ~1e-6 even when the tensors agree to 1e-6 overall.
        norm = math.sqrt(sum(a * a for a in expected)) or 1.0
        relative = math.sqrt(sum((a - b) ** 2 for a, b in zip(expected, got, strict=True))) / norm
        assert max_abs <= atol or relative <= rtol, (
            f"parameter {name}: max |diff| {max_abs:.3g}, relative {relative:.3g}"
        )
