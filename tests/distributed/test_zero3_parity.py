"""ort_zero's ZeRO-3 hooks against native DeepSpeed ZeRO-3: 2 CPU ranks, same seed and data, 20 Adam steps.

The PyTorch path must match native to 1e-6; the ORT path (fallback disabled, ORT session and bridge PythonOps
checked) to 1e-5 relative.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from parity import BRIDGES, assert_same_training, train

VARIANTS = ["base", "accum", "offload", "clip", "leaf"]


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    cache: dict[tuple[str, str], dict] = {}

    def get(variant: str, model: str = "zoo") -> dict:
        if (variant, model) not in cache:
            cache[variant, model] = train(
                tmp_path_factory.mktemp(f"native_{model}_{variant}"), "native", variant, model=model
            )
        return cache[variant, model]

    return get  # type: ignore[return-value]


@pytest.mark.parametrize("variant", VARIANTS)
def test_pytorch_path_matches_native(tmp_path: Path, native, variant: str) -> None:
    result = train(tmp_path, "torch", variant)
    assert result["ort_zero_hooks"], "ort_zero's subscriber was not installed"
    assert_same_training(native(variant), result, rtol=0.0, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_ort_path_matches_native(tmp_path: Path, native, variant: str) -> None:
    result = train(tmp_path, "ort", variant)
    assert result["ort_zero_hooks"] and result["ort_session"], "ORT did not run"
    assert BRIDGES <= set(result["python_ops"]), f"bridges missing from the ORT graph: {result['python_ops']}"
    assert_same_training(native(variant), result, rtol=1e-5, atol=1e-6)


def test_ort_env_switch_matches_native(tmp_path: Path, native) -> None:
    """ORT's own switch (ORTMODULE_ENABLE_ZERO_STAGE3=1, honoured when ort_zero is imported) gives the same run."""
    result = train(tmp_path, "ort", "base", "--switch", "env")
    assert result["ort_session"] and BRIDGES <= set(result["python_ops"])
    assert_same_training(native("base"), result, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["gpt", "gpt2", "bert"])
def test_ort_transformer_models_match_native(tmp_path: Path, native, model: str) -> None:
    """ort_zero's small GPT, and transformers 4.46.3 GPT-2 and BERT built from small configs, in ORT under ZeRO-3."""
    result = train(tmp_path, "ort", "base", model=model)
    assert result["ort_session"] and BRIDGES <= set(result["python_ops"])
    assert_same_training(native("base", model), result, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
