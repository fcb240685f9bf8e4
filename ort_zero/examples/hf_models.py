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
    type's config knows (directly or through its attribute_map) and does not derive from others is set, in the
    config and in each config it is made of (a multimodal model's text and vision configs). Dropout is off: ORT and
    PyTorch draw different masks, and the two runs are compared step by step."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(args.model_type)
    _shrink(config, small_sizes(args), args.layers)
    return config


def small_sizes(args: argparse.Namespace) -> dict[str, Any]:
    hidden, head_dim = args.hidden_size, args.hidden_size // args.heads
    return {
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.heads,
        "intermediate_size": 4 * hidden,
        "ffn_dim": 4 * hidden,  # OPT
        "word_embed_proj_dim": hidden,  # OPT: otherwise a projection from 768
        # encoder-decoder types (their decoder is the causal LM): sizes named per side
        "d_model": hidden,
        **{f"{side}_{name}": value for side in ("encoder", "decoder") for name, value in [
            ("layers", args.layers), ("attention_heads", args.heads), ("ffn_dim", 4 * hidden)]},
        # twice the sequence: RoBERTa-like position ids start after the padding index
        "max_position_embeddings": 2 * args.seq_len,
        "head_dim": head_dim,  # Gemma: otherwise 256
        "rotary_dim": head_dim,  # GPT-J, CodeGen: otherwise 64
        # multi-head latent attention (DeepSeek-V2/V3 and their kin): ranks and head parts of the same small size
        "q_lora_rank": hidden // 2,
        "kv_lora_rank": hidden // 2,
        "qk_rope_head_dim": head_dim,
        "qk_nope_head_dim": head_dim,
        "v_head_dim": head_dim,
        # mixture of experts: 4 experts, 2 per token, at most one shared, in one group
        **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
        **dict.fromkeys(("n_shared_experts", "num_shared_experts"), 1),
        "num_experts_per_tok": 2,
        **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size"), 2 * hidden),
        **dict.fromkeys(("n_group", "topk_group"), 1),
        "pad_token_id": 0,  # token ids inside the byte vocabulary (padding_idx of some embeddings)
        "bos_token_id": 1,
        "eos_token_id": 2,
    }  # fmt: skip


def _shrink(config: Any, sizes: dict[str, Any], layers: int) -> None:
    config.use_cache = False  # training: no key/value cache among the outputs
    for name, value in sizes.items():
        if hasattr(config, name) and _settable(config, name):
            setattr(config, name, value)
    for name, value in config.to_dict().items():
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            setattr(config, name, 0.0)
    layer_types = getattr(config, "layer_types", None)  # one per layer (e.g. sliding or full attention)
    if isinstance(layer_types, list) and _settable(config, "layer_types"):
        config.layer_types = layer_types[:layers]
    for name in getattr(config, "sub_configs", {}):
        part = getattr(config, name, None)
        if part is not None and hasattr(part, "to_dict"):
            _shrink(part, sizes, layers)


def _settable(config: Any, name: str) -> bool:
    """Not a value the config derives from others (e.g. Falcon's head_dim: a property without a setter), also
    through its attribute_map (Bamba's layer_types)."""
    name = getattr(config, "attribute_map", {}).get(name, name)
    derived = getattr(type(config), name, None)
    return not (isinstance(derived, property) and derived.fset is None)


def build_model(args: argparse.Namespace) -> tuple[torch.nn.Module, dict[str, int]]:
    """The model, built after TrainingArguments so that a ZeRO-3 config builds it under deepspeed.zero.Init; with
    --lora wrapped in PEFT LoRA adapters. Also what its parameters looked like right after construction."""
    from transformers import AutoModelForCausalLM, set_seed

    set_seed(args.seed)
    # Mixture-of-experts layers as one batched matmul over (token, expert) pairs: the default (grouped_mm) counts
    # tokens per expert with torch.histc, which ORT's TorchScript export cannot export (docs/huggingface.md).
    options = {"attn_implementation": args.attn_implementation, "experts_implementation": "batched_mm"}
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
