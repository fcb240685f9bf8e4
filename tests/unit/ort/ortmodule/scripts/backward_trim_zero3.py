"""One process, one rank: a small LLaMA under DeepSpeed ZeRO-3 in an ORTModule, trained two steps; prints, as JSON,
how many of the forward's MLP activations (torch tensors of the intermediate size) were still alive at each trim
after a backward. Run by tests/unit/ort/ortmodule/test_footprint.py."""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import tempfile

import torch

import ort_zero  # noqa: I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.inspection import ort_run_record
from ort_zero.ort.ortmodule import footprint

INTERMEDIATE = 1536  # no other tensor of the model ends in this size
AFTER_BACKWARD = ("backward_then_trim", "run_backward_then_trim")


def activations_alive() -> int:
    return sum(isinstance(o, torch.Tensor) and o.dim() == 3 and o.shape[-1] == INTERMEDIATE for o in gc.get_objects())


def main() -> None:
    import deepspeed
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    os.environ.update(ORTMODULE_FALLBACK_POLICY="FALLBACK_DISABLE", DS_ACCELERATOR="cpu", LOCAL_RANK="0")
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    alive_at_trims: list[int] = []
    trim = footprint.heap.give_back_freed_memory

    def recorded_trim() -> None:
        if sys._getframe(1).f_code.co_name in AFTER_BACKWARD:
            alive_at_trims.append(activations_alive())
        trim()

    footprint.heap.give_back_freed_memory = recorded_trim
    ort_zero.enable_zero3()
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    keep = HfDeepSpeedConfig(config)  # noqa: F841 - while it lives, the model is built under zero.Init
    torch.manual_seed(0)
    llama = LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=INTERMEDIATE, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=512,
    )  # fmt: skip
    model = ortmodule.ORTModule(LlamaForCausalLM(llama))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    ids = torch.randint(0, llama.vocab_size, (1, 512))
    for _ in range(2):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    record = ort_run_record(model)["training"]
    print(json.dumps({"alive_at_backward_trims": alive_at_trims, "ort_ran": bool(record["session"])}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
