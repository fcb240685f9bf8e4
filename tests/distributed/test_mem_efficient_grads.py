"""Memory-efficient gradients under DeepSpeed on 2 CPU ranks: ZeRO-0/1/2 (each parameter through its own
ParamRetrieval PythonOp) and ZeRO-3 (the bridges already hand gradients over one by one) against native runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from parity import assert_ran_in_ort, assert_same_training, train

RETRIEVAL = "ort_zero.ort.mem_grad_rewrite.ParamRetrieval"


@pytest.mark.parametrize(("stage", "variant"), [(2, "base"), (2, "accum"), (1, "base"), (0, "base")])
def test_zero012_mem_efficient_grads_match_native(tmp_path: Path, stage: int, variant: str) -> None:
    native = train(tmp_path / "native", "native", variant, "--stage", str(stage))
    result = train(tmp_path / "ort", "ort", variant, "--stage", str(stage), "--mem-grads")
    assert_ran_in_ort(result, training_ops=frozenset({RETRIEVAL}))
    assert_same_training(native, result, rtol=1e-5, atol=1e-6)


def test_zero3_with_mem_efficient_grads_switch_matches_native(tmp_path: Path) -> None:
    """Every ZeRO-3 parameter already comes from a bridge, so the switch leaves no parameter input to rewrite."""
    native = train(tmp_path / "native", "native", "base")
    result = train(tmp_path / "ort", "ort", "base", "--mem-grads")
    assert_ran_in_ort(result)
    assert RETRIEVAL not in result["python_ops"]
    assert_same_training(native, result, rtol=1e-5, atol=1e-6)
