"""The causal LM `train_hf` trains: any type transformers builds, from config at a small size over a byte
vocabulary (or from a saved model), optionally with LoRA adapters."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from ort_zero.examples.rank_run import UsageError

VOCAB = 256  # bytes


def model_config(args: argparse.Namespace) -> Any:
    """`AutoConfig.for_model` at a small size. Each type names its sizes in its own way; every name below that the
    type's config knows (directly or through its attribute_map) and does not derive from others is set. Dropout is
    off: ORT and PyTorch draw different masks, and the two runs are compared step by step."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(args.model_type)
    head_dim = args.hidden_size // args.heads
    sizes = {
        "vocab_size": VOCAB,
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads,
        "intermediate_size": 4 * args.hidden_size,
        "ffn_dim": 4 * args.hidden_size,  # OPT
        "word_embed_proj_dim": args.hidden_size,  # OPT: otherwise a projection from 768
        "max_position_embeddings": args.seq_len,
        "head_dim": head_dim,  # Gemma: otherwise 256
        "rotary_dim": head_dim,  # GPT-J, CodeGen: otherwise 64
        "pad_token_id": 0,  # token ids inside the byte vocabulary (padding_idx of some embeddings)
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    for name, value in sizes.items():
        derived = getattr(type(config), name, None)  # e.g. Falcon's head_dim: a property without a setter
        if hasattr(config, name) and not (isinstance(derived, property) and derived.fset is None):
            setattr(config, name, value)
    for name, value in config.to_dict().items():
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            setattr(config, name, 0.0)
    if isinstance(getattr(config, "layer_types", None), list):  # one per layer (e.g. sliding or full attention)
        config.layer_types = config.layer_types[: args.layers]
    config.use_cache = False  # training: no key/value cache among the outputs
    return config


def build_model(args: argparse.Namespace) -> tuple[torch.nn.Module, dict[str, int]]:
    """The model, built after TrainingArguments so that a ZeRO-3 config builds it under deepspeed.zero.Init; with
    --lora wrapped in PEFT LoRA adapters. Also what its parameters looked like right after construction."""
    from transformers import AutoModelForCausalLM, set_seed

    set_seed(args.seed)
    # Mixture-of-experts layers as one batched matmul over (token, expert) pairs: the default (grouped_mm) counts
    # tokens per expert with torch.histc, which ORT's TorchScript export cannot export (docs/huggingface.md).
    options = {"attn_implementation": "eager", "experts_implementation": "batched_mm"}
    if args.init_from is not None:  # also under zero.Init: each rank loads only its partitions' values
        model = AutoModelForCausalLM.from_pretrained(args.init_from, **options)
    else:
        model = AutoModelForCausalLM.from_config(model_config(args), **options)
    params = list(model.parameters())
    built = {
        "params": len(params),
        "partitioned": sum(hasattr(p, "ds_id") for p in params),
        "local_numel": sum(p.numel() for p in params),
        "full_numel": sum(getattr(p, "ds_numel", p.numel()) for p in params),
    }
    if args.lora:
        from peft import LoraConfig, get_peft_model

        try:
            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM"))
        except ValueError as error:  # peft knows no default target modules for this type
            raise UsageError(f"--lora with --model-type {args.model_type}: {error}") from None
    return model, built
