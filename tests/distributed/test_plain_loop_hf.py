"""A Hugging Face causal LM as it comes (`use_cache=True`: its outputs carry a `DynamicCache`) trains in the README's
plain DeepSpeed loop, `ORTModule(model)` after `ort_zero.enable_zero3()`, with native DeepSpeed ZeRO-3's per-step
losses (within 1e-5) on 2 CPU ranks under torchrun, and returns its cache as natively. Four families in one launch
(scripts/plain_loop_hf.py), each natively and in ORT."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import free_port, read_rank_results, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "plain_loop_hf.py"
FAMILIES = ["llama", "bloom", "qwen3", "gpt2"]
STEPS = 4
TOLERANCE = 1e-5
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("plain-loop-hf")
    argv = ["--out", str(out), "--families", ",".join(FAMILIES), "--steps", str(STEPS)]
    run_launcher(torchrun_cmd(SCRIPT, argv, port=free_port()), timeout=600, cwd=ROOT)
    return read_rank_results(out)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_at_its_defaults_trains_in_ort_as_natively(ranks: list[dict], family: str) -> None:
    for rank, results in enumerate(ranks):
        native, ort = results[f"{family}/native"], results[f"{family}/ort"]
        assert native["use_cache"] and ort["use_cache"], "not the config's default: the test proves nothing"
        assert ort["hooks"] and ort["ort"]["session"], f"rank {rank}: no ORT session ran"
        assert BRIDGES <= set(ort["ort"]["python_ops"]), ort["ort"]
        assert native["cache"] == ort["cache"] == "DynamicCache"
        assert native["cache_layers"] == ort["cache_layers"] != []
        diffs = [abs(a - b) for a, b in zip(native["losses"], ort["losses"], strict=True)]
        assert len(diffs) == STEPS and max(diffs) <= TOLERANCE, (
            f"{family}, rank {rank}: {native['losses']} vs {ort['losses']}"
        )
        assert native["losses"][-1] < native["losses"][0], f"PyTorch did not learn, the test proves nothing: {native}"
