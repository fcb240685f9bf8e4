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
    config, in its per-layer overrides and in each config it is made of (a multimodal model's text and vision
    configs); the few types that derive sizes from their defaults are set by name (`_own_sizes`). Dropout is off:
    ORT and PyTorch draw different masks, and the two runs are compared step by step."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(args.model_type)
    _shrink(config, small_sizes(args), args.layers, args)
    return config


def causal_lm_from_config(config: Any, **options: Any) -> torch.nn.Module:
    """`AutoModelForCausalLM.from_config`, which builds the causal LM class from the whole config or from its
    `text_config` where the class takes that; here also from another part of it that the class takes: MusicGen's
    causal LM is its decoder, built from `config.decoder` (the auto class hands it the whole config)."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from ort_zero.foreign.transformers import model_from_config

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)] if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else None
    sub_configs = getattr(config, "sub_configs", {})
    if (
        model_class is not None
        and not isinstance(config, model_class.config_class)
        and sub_configs.get("text_config") != model_class.config_class  # the auto class's own case
    ):
        parts = (getattr(config, name, None) for name in sub_configs)
        part = next((part for part in parts if isinstance(part, model_class.config_class)), None)
        if part is not None:
            return model_from_config(model_class, part, **options)
    return AutoModelForCausalLM.from_config(config, **options)  # also transformers' error for what it cannot build


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
        **dict.fromkeys((
            "moe_intermediate_size", "shared_expert_intermediate_size", "shared_experts_intermediate_size"),
            2 * hidden),
        **dict.fromkeys(("n_group", "topk_group"), 1),
        "first_k_dense_replace": 1,  # DeepSeek-V2/V3: experts from the second layer on (otherwise from the fourth)
        "zero_expert_num": 1,  # LongCat: experts that return their input, otherwise 256 of them beside 4 real ones
        "ffn_hidden_size": 4 * hidden,  # DBRX's experts
        "qk_head_dim": 2 * head_dim,  # LongCat: the nope and rope parts, derived from the default sizes otherwise
        # Mamba-2 mixers (Bamba, GraniteMoeHybrid, FalconH1): as many heads as the attention, over twice the hidden
        "mamba_expand": 2,
        "mamba_n_heads": args.heads,
        "mamba_d_head": 2 * hidden // args.heads,  # derived from the default sizes otherwise
        "mamba_d_ssm": 2 * hidden,  # FalconH1: the mixer's inner size, 1024 otherwise
        **dict.fromkeys(("mamba_d_state", "state_size"), 16),  # Mamba-2's state: 128 or 256 otherwise
        # the lightning indexer of DeepSeek sparse attention (Dots3): heads of the attention's size
        "index_head_dim": head_dim,
        "index_n_heads": args.heads,
        # sizes a type names its own way
        **dict.fromkeys(("num_encoder_layers", "num_decoder_layers", "num_blocks"), args.layers),  # ProphetNet, xLSTM
        "embedding_dim": hidden,  # xLSTM
        "d_head": head_dim,  # XLNet: derived from the default sizes otherwise
        "d_inner": 4 * hidden,  # XLNet's feed-forward
        "adapter_out_dim": hidden,  # Dots3's vision adapter: into the text model's width
        "decoder_vocab_size": VOCAB,  # Marian: its output vocabulary, otherwise 58101
        "pad_token_id": 0,  # token ids inside the byte vocabulary (padding_idx of some embeddings)
        "bos_token_id": 1,
        "eos_token_id": 2,
    }  # fmt: skip


def _shrink(config: Any, sizes: dict[str, Any], layers: int, args: argparse.Namespace) -> None:
    config.use_cache = False  # training: no key/value cache among the outputs
    # a heterogeneous config (Gemma 4, Dots3: some layers of other sizes) refuses to read those sizes globally: its
    # per-layer overrides are set aside, shrunk as the config is, and kept for the layers the small model has
    heterogeneous = getattr(config, "is_heterogeneous", False)
    if heterogeneous:
        overrides = config.to_dict().get("per_layer_config") or {}
        config.per_layer_config = None
    for name, value in sizes.items():
        if hasattr(config, name) and _settable(config, name):
            try:
                setattr(config, name, value)
            except NotImplementedError:  # a setter that refuses (XLNet has no position limit, ProphetNet per side)
                pass
    for name, value in config.to_dict().items():
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            setattr(config, name, 0.0)
    for name in ("layer_types", "mlp_layer_types"):  # one per layer (e.g. sliding or full attention, dense or MoE)
        per_layer_list = getattr(config, name, None)
        if isinstance(per_layer_list, list) and _settable(config, name):
            setattr(config, name, per_layer_list[:layers])
    if heterogeneous:
        config.per_layer_config = {
            index: {name: sizes.get(name, value) for name, value in override.items()}
            for index, override in ((int(i), o) for i, o in overrides.items())
            if index < layers
        }
    for name in getattr(config, "sub_configs", {}):
        part = getattr(config, name, None)
        if part is not None and hasattr(part, "to_dict"):
            _shrink(part, sizes, layers, args)
    _own_sizes(config, args)  # after its parts: BLT derives from its encoder's size


def _own_sizes(config: Any, args: argparse.Namespace) -> None:
    """The few types that name or derive their sizes in their own way (from the default sizes, in __post_init__),
    or that do not build or run at all with their defaults."""
    hidden, heads, head_dim = args.hidden_size, args.heads, args.hidden_size // args.heads
    model_type = getattr(config, "model_type", "")

    def alternating(first: Any, second: Any) -> list[Any]:  # one of each kind of layer in 2 layers
        return [second if i % 2 else first for i in range(args.layers)]

    if model_type == "zamba2":  # its shared attention is twice as wide as the model; heads derived from defaults
        config.attention_hidden_size, config.attention_head_dim = 2 * hidden, 2 * hidden // heads
        config.kv_channels, config.num_query_groups = head_dim, heads
        config.mamba_headdim = 2 * hidden // config.n_mamba_heads
        config.layers_block_type = alternating("linear_attention", "hybrid")
        config.hybrid_layer_ids = [i for i, kind in enumerate(config.layers_block_type) if kind == "hybrid"]
        config.adapter_rank = head_dim
    elif model_type == "mamba2":  # num_heads * head_dim must be twice the hidden size; a rank derived from defaults
        config.num_heads, config.time_step_rank = 2 * hidden // config.head_dim, -(-hidden // 16)
    elif model_type == "blt":  # hash embeddings of 500002 rows per group; a projection derived from defaults
        config.encoder_hash_byte_group_vocab = VOCAB
        for part in (config.encoder_config, config.decoder_config):
            part.hidden_size_global = hidden
        cross = config.encoder_config.hidden_size * config.cross_attn_k
        config.global_config.encoder_cross_output_size = cross if cross != hidden else None
    elif model_type == "dbrx":  # its attention reads rope_theta and clamps with clip_qkv: neither set by default
        config.attn_config.rope_theta, config.attn_config.clip_qkv = config.rope_parameters["rope_theta"], 8.0
    elif model_type == "cohere_compass_text":  # its rotary embedding reads parameters per layer type, none by default
        config.rope_parameters = {t: {"rope_type": "default", "rope_theta": 10000.0} for t in set(config.layer_types)}
    elif model_type == "dots3_note_text":  # a head is its nope and rope parts; its rotary part derived from defaults
        config.head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
        for parameters in config.rope_parameters.values():
            parameters["partial_rotary_factor"] = config.qk_rope_head_dim / config.head_dim
    elif model_type in ("qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text"):
        # the rotary part of a head holds the three interleaved mrope sections, as in real configs (the default
        # (11, 11, 10) fits a 256-wide head, a quarter of it rotary). At head_dim 8 the H and W sections are empty:
        # torch writes nothing for them, and ORT's optimizer drops the Add that broadcasts the rotary table to the
        # empty index (its Reshape then fails at run time)
        config.head_dim = round(8 / config.rope_parameters.get("partial_rotary_factor", 1.0))  # 4 frequencies
        config.rope_parameters["mrope_section"] = [2, 1, 1]
    elif model_type in ("gemma3n_text", "gemma4_text", "gemma4_unified_text"):
        config.num_kv_shared_layers = 0  # the last 15 layers reuse earlier layers' keys and values otherwise
        config.vocab_size_per_layer_input, config.hidden_size_per_layer_input = VOCAB, head_dim  # 262144 x 256
        if model_type == "gemma3n_text":  # one MLP size per layer
            config.intermediate_size = [4 * hidden] * args.layers
            config.activation_sparsity_pattern = config.activation_sparsity_pattern[: args.layers]
    elif model_type == "lfm2_moe":  # no layer types by default; its first 2 layers dense (all of a tiny model)
        config.layer_types, config.num_dense_layers = alternating("conv", "full_attention"), 1
    elif model_type == "mimo_v2_flash":  # its sliding-window layers have twice the key/value heads
        config.num_key_value_heads = max(1, heads // 2)
    elif model_type == "reformer":  # a decoder to be a causal LM; layers named by kind; axial positions over seq_len
        config.is_decoder, config.attn_layers = True, alternating("local", "lsh")
        config.attention_head_size, config.feed_forward_size = head_dim, 4 * hidden
        config.axial_pos_shape, config.axial_pos_embds_dim = (1, args.seq_len), (hidden // 4, hidden - hidden // 4)
    elif model_type == "xmod":  # one adapter per language: use the first without asking for a language id
        config.default_language = config.languages[0]


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
    options = {"attn_implementation": args.attn_implementation}
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


def numels(model: torch.nn.Module) -> dict[str, int]:
    """Elements of the whole model and of what trains (the adapters alone with --lora)."""
    params = list(model.parameters())
    return {
        "full_numel": sum(getattr(p, "ds_numel", p.numel()) for p in params),
        "trainable_numel": sum(getattr(p, "ds_numel", p.numel()) for p in params if p.requires_grad),
    }
