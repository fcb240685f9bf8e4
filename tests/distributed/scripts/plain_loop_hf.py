"""Hugging Face causal LMs as they come (tiny from config, `use_cache` and every other setting at the type's
default, dropout off), trained by the README's plain DeepSpeed loop: natively, then `ort_zero.enable_zero3()` and
`ORTModule(model)` before `deepspeed.initialize`, one family after the other in the same ranks. Each rank writes
<out>/rank<r>.json: per family and mode the per-step losses, what the output's `past_key_values` was, and for ORT
the run record.

    torchrun --nproc_per_node 2 plain_loop_hf.py --out DIR --families llama,bloom --steps 4
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import deepspeed
import torch

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 64},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10**9,
}
SEQ_LEN = 16


def config_at_defaults(family: str) -> Any:
    """The example's tiny config of `family` with the type's own `use_cache` (the example turns it off)."""
    from transformers import AutoConfig

    from ort_zero.examples import hf_models, train_hf

    args = train_hf.parse_args(["--model-type", family, "--deepspeed", "unused", "--seq-len", str(SEQ_LEN)])
    config = hf_models.model_config(args)
    config.use_cache = AutoConfig.for_model(family).use_cache
    return config


def train(family: str, ort: bool, steps: int, rank: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    import ort_zero

    config = config_at_defaults(family)
    if ort:
        ort_zero.enable_zero3()  # before deepspeed.initialize
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if ort:
        from onnxruntime.training.ortmodule import ORTModule

        model = ORTModule(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, eps=1e-6)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=DS_CONFIG)
    result: dict[str, Any] = {"use_cache": config.use_cache, "losses": []}
    ids = torch.randint(0, config.vocab_size, (2, SEQ_LEN), generator=torch.Generator().manual_seed(rank))
    for _ in range(steps):  # one batch per rank, again and again: the loss must fall
        outputs = engine(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
        engine.backward(outputs.loss)
        engine.step()
        result["losses"].append(outputs.loss.item())
        cache = outputs.past_key_values
        result["cache"] = type(cache).__name__
        result["cache_layers"] = [list(layer.keys.shape) for layer in getattr(cache, "layers", [])]
    if ort:
        from ort_zero.ort.inspection import ort_run_record

        result["ort"] = ort_run_record(engine.module)["training"]
        result["hooks"] = ort_zero.is_zero3_enabled()
        ort_zero.disable_zero3()  # the next native run is DeepSpeed's own
    engine.destroy()
    del engine, model, optimizer
    gc.collect()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", required=True)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    from ort_zero.distributed import init_distributed, shut_down_distributed

    rank, _ = init_distributed()
    results = {
        f"{family}/{'ort' if ort else 'native'}": train(family, ort, args.steps, rank)
        for family in args.families.split(",")
        for ort in (False, True)
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(results, indent=1) + "\n")
    shut_down_distributed()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    sys.exit(main())
