"""The sweep's verdict per type: what counts as training in ORT, and what is native's failure, not ORT's."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ort_zero.tools import causal_lm_sweep

RAN_IN_ORT = {
    "session": True,
    "python_ops": ["ort_zero.zero3.bridges.PreForwardBridge"],
    "attn_implementation": "eager",
}


def _runs(native: list[float], ort: list[float]) -> Any:
    def train(model_type: str, attn: str, steps: int, in_ort: bool) -> tuple[list[float], dict[str, Any]]:
        return (ort, RAN_IN_ORT) if in_ort else (native, {"attn_implementation": "eager"})

    return train


@pytest.mark.parametrize(
    ("native", "ort", "status"),
    [
        ([5.5, 5.4], [5.5, 5.4 + 5e-6], "trains"),
        ([5.5, 5.4], [5.5, 5.4 + 5e-5], "losses differ"),
        ([math.nan, math.nan], [math.nan, math.nan], "native fails"),  # NaN natively: nothing to agree with
        ([5.5, math.inf], [5.5, 5.4], "native fails"),
    ],
)
def test_status(monkeypatch: pytest.MonkeyPatch, native: list[float], ort: list[float], status: str) -> None:
    monkeypatch.setattr(causal_lm_sweep, "_train", _runs(native, ort))
    result = causal_lm_sweep._sweep_one("gpt2", "default", len(native))
    assert result["status"] == status
    if status == "native fails":
        assert "losses" in result["error"] and "ort" not in result


def test_not_in_ort_when_no_bridge_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    def train(model_type: str, attn: str, steps: int, in_ort: bool) -> tuple[list[float], dict[str, Any]]:
        return [5.5], ({"session": False, "python_ops": []} if in_ort else {"attn_implementation": "sdpa"})

    monkeypatch.setattr(causal_lm_sweep, "_train", train)
    assert causal_lm_sweep._sweep_one("gpt2", "default", 1)["status"] == "not in ORT"
