"""train_hf rejects bad input with one message and exit code 2, before the process group or DeepSpeed start; its
model configs are small for every causal LM type."""

from __future__ import annotations

from pathlib import Path

import pytest

from ort_zero.data import CorpusWindows
from ort_zero.examples import hf_models, train_hf

CONFIGS = Path(__file__).resolve().parents[3] / "ds_configs"
HF_CONFIG = str(CONFIGS / "zero3_hf_auto.json")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert train_hf.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("train_hf: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_not_a_causal_lm_type(capsys: pytest.CaptureFixture[str]) -> None:
    err = run(capsys, "--deepspeed", HF_CONFIG, "--model-type", "t5")
    assert "'t5' is not a type AutoModelForCausalLM builds" in err and "llama" in err


def test_missing_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = run(capsys, "--deepspeed", str(tmp_path / "missing.json"))
    assert "not found" in err and "missing.json" in err


def test_zero2_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert "needs ZeRO stage 3" in run(capsys, "--deepspeed", str(CONFIGS / "zero2_cpu_fp32.json"))


def test_sizes_must_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--max-steps must be positive" in run(capsys, "--deepspeed", HF_CONFIG, "--max-steps", "0")
    err = run(capsys, "--deepspeed", HF_CONFIG, "--gradient-accumulation-steps", "0")
    assert "--gradient-accumulation-steps must be positive" in err
    err = run(capsys, "--deepspeed", HF_CONFIG, "--hidden-size", "30", "--heads", "4")
    assert "--hidden-size 30 must be a multiple of --heads 4" in err


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "opt", "gemma", "gptj", "bloom", "falcon", "qwen2", "gemma2"])
def test_model_config_is_small_whatever_the_names(model_type: str) -> None:
    """Each type names its sizes its own way (n_embd, ffn_dim, head_dim, rotary_dim...): all come out small, and
    valid (transformers 5 checks that `layer_types` has one entry per layer)."""
    args = train_hf.parse_args(["--deepspeed", HF_CONFIG, "--model-type", model_type, "--hidden-size", "32"])
    config = hf_models.model_config(args)
    assert config.vocab_size == 256 and config.hidden_size == 32 and config.num_hidden_layers == 2
    for name in ("head_dim", "rotary_dim"):
        assert getattr(config, name, 8) == 8, name
    assert getattr(config, "word_embed_proj_dim", 32) == 32
    dropouts = {k: v for k, v in config.to_dict().items() if isinstance(v, float) and "drop" in k}
    assert all(v == 0.0 for v in dropouts.values()), dropouts
    assert not config.use_cache
    assert len(getattr(config, "layer_types", None) or [None, None]) == 2
    config.validate()


def test_the_parts_of_a_composite_config_are_small_too() -> None:
    """A multimodal type's text and vision configs (Gemma 3: 4B parameters at their defaults), mixture-of-experts
    and multi-head latent attention sizes (DeepSeek-V2: no experts per token by default) come out small."""
    args = train_hf.parse_args(["--deepspeed", HF_CONFIG, "--model-type", "gemma3"])
    config = hf_models.model_config(args)
    for part in (config.text_config, config.vision_config):
        assert part.hidden_size == 32 and part.num_hidden_layers == 2 and part.intermediate_size == 128
    assert not config.text_config.use_cache
    args = train_hf.parse_args(["--deepspeed", HF_CONFIG, "--model-type", "deepseek_v2"])
    config = hf_models.model_config(args)
    assert (config.n_routed_experts, config.num_experts_per_tok, config.kv_lora_rank) == (4, 2, 16)


def test_attention_is_from_pretrained_s_unless_chosen() -> None:
    assert train_hf.parse_args(["--deepspeed", HF_CONFIG]).attn_implementation is None
    argv = ["--deepspeed", HF_CONFIG, "--attn-implementation", "eager"]
    assert train_hf.parse_args(argv).attn_implementation == "eager"


def test_corpus_windows_are_reproducible_causal_lm_items() -> None:
    first, again = CorpusWindows(5, 8, 16), CorpusWindows(5, 8, 16)
    item = first[3]
    assert item["input_ids"].shape == (16,) and item["input_ids"].dtype.is_floating_point is False
    assert (item["input_ids"] == item["labels"]).all()  # Hugging Face causal LMs shift the labels themselves
    assert all((first[i]["input_ids"] == again[i]["input_ids"]).all() for i in range(8))
    assert not (CorpusWindows(6, 8, 16).windows == first.windows).all()


def test_batches_carry_the_attention_mask_a_tokenizer_gives() -> None:
    """All ones (no window is padded): with it, transformers 5 models skip their search for packed sequences."""
    windows = CorpusWindows(5, 4, 16)
    batch = train_hf.collate([windows[i] for i in range(4)])
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    assert (batch["input_ids"] == windows.windows).all() and (batch["labels"] == windows.windows).all()
    assert batch["attention_mask"].shape == (4, 16) and (batch["attention_mask"] == 1).all()
