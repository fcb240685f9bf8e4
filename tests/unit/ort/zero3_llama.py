"""What the one-rank ZeRO-3 LLaMA scripts under tests/unit/ort/*/scripts share: a small LLaMA built under
`deepspeed.zero.Init` in an ORTModule (fallback off, ort_zero enabled), on a one-process gloo group."""

from __future__ import annotations

import importlib
import os
import tempfile
from typing import Any

import torch

import ort_zero  # noqa: I001  (before ORT: makes ORTModule importable on today's torch)

CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
}


def llama_engine(model_type: str = "llama", **llama_options: Any) -> tuple[Any, torch.nn.Module, Any]:
    """(DeepSpeed engine, the ORTModule, the config) of the causal LM of `model_type` (LLaMA's unless said) and its
    config of `llama_options`, seeded; the caller ends with `torch.distributed.destroy_process_group()`."""
    import deepspeed
    import torch.distributed as dist
    from transformers import AutoConfig
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    os.environ.update(ORTMODULE_FALLBACK_POLICY="FALLBACK_DISABLE", DS_ACCELERATOR="cpu", LOCAL_RANK="0")
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    ort_zero.enable_zero3()
    keep = HfDeepSpeedConfig(CONFIG)  # noqa: F841 - while it lives, the model is built under zero.Init
    torch.manual_seed(0)
    llama = AutoConfig.for_model(model_type, **llama_options)
    model = ortmodule.ORTModule(MODEL_FOR_CAUSAL_LM_MAPPING[type(llama)](llama))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    return engine, model, llama
