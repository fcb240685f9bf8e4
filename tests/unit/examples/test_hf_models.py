"""The types that name or derive their sizes their own way come out small from `hf_models.model_config` and build and
run a training step natively, from config (no download)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ort_zero.examples import hf_models, train_hf

HF_CONFIG = str(Path(__file__).resolve().parents[3] / "ds_configs" / "zero3_hf_auto.json")

# Each did not build or run at the small size before its sizes were set by name (docs/model-families.md).
OWN_WAY = [
    "bamba", "blt", "cohere_compass_text", "dbrx", "dots3_note", "dots3_note_text", "gemma3n_text", "gemma4",
    "gemma4_text", "gemma4_unified", "gemma4_unified_text", "granitemoehybrid", "lfm2_moe", "longcat_flash", "mamba2",
    "marian", "mimo_v2_flash", "prophetnet", "reformer", "xlnet", "xlstm", "xmod", "zamba2",
]  # fmt: skip


def config_of(model_type: str, *extra: str):  # noqa: ANN201 - a transformers config
    return hf_models.model_config(
        train_hf.parse_args(["--deepspeed", HF_CONFIG, "--model-type", model_type, "--hidden-size", "32", *extra])
    )


@pytest.mark.parametrize("model_type", OWN_WAY)
def test_builds_small_and_trains_a_step(model_type: str) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_of(model_type), experts_implementation="batched_mm")
    assert sum(p.numel() for p in model.parameters()) < 400_000
    ids = torch.randint(3, 256, (2, 32))
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids.clone()).loss
    loss.backward()
    assert math.isfinite(loss.item())


def test_per_layer_overrides_are_small_too() -> None:
    """Gemma 4's full-attention layers and Dots3's sliding-window layers have sizes of their own (head_dim 512,
    64 heads): per layer, they come out small, for the layers the small model has."""
    config = config_of("gemma4_text", "--layers", "6")
    assert config.layer_types[5] == "full_attention"
    assert [config.per_layer_config[i].head_dim for i in range(6)] == [8] * 6
    config = config_of("dots3_note_text", "--layers", "3")
    assert config.layer_types[2] == "sliding_attention"
    layer = config.per_layer_config[2]
    assert (layer.num_attention_heads, layer.kv_lora_rank, layer.head_dim) == (4, 16, 16)
    config.validate()


def test_sizes_behind_refusing_setters_and_derived_ones() -> None:
    """XLNet has no position limit and ProphetNet sets its layers per side (their setters raise); sizes derived in
    __post_init__ from the defaults (Bamba's Mamba head, Zamba2's attention) follow the small sizes."""
    config = config_of("prophetnet")
    assert (config.num_encoder_layers, config.num_decoder_layers) == (2, 2)
    config = config_of("xlnet")
    assert (config.d_model, config.d_head, config.n_layer) == (32, 8, 2)
    config = config_of("bamba")
    assert config.mamba_n_heads * config.mamba_d_head == 2 * config.hidden_size
    config = config_of("zamba2", "--layers", "4")
    assert (config.attention_hidden_size, config.mamba_headdim, config.hybrid_layer_ids) == (64, 8, [1, 3])
    for model_type in ("bamba", "zamba2", "mamba2", "xlnet", "dbrx", "reformer"):
        config_of(model_type).validate()


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "qwen3_5", "qwen4_exp_text"])
def test_the_mrope_sections_fit_the_rotary_frequencies(model_type: str) -> None:
    """The rotary embedding interleaves its H and W sections at frequencies 1, 4, .. and 2, 5, .. below 3 x section:
    each must hold at least one of the head's rotary frequencies (an empty one makes ORT drop an Add, see hf_models)."""
    config = config_of(model_type)
    config = getattr(config, "text_config", config)
    rope = config.rope_parameters
    frequencies = int(config.head_dim * rope.get("partial_rotary_factor", 1.0)) // 2
    for offset, section in zip((1, 2), rope["mrope_section"][1:], strict=True):
        assert range(offset, min(3 * section, frequencies), 3), (model_type, frequencies, rope["mrope_section"])
