"""Every shipped DeepSpeed config parses in DeepSpeed's own config class and passes ort_zero's checks.

`DeepSpeedConfig` reads the world size from torch.distributed and falls back to 1 when no process group exists, so
no distributed init is needed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from deepspeed.runtime.config import DeepSpeedConfig

from ort_zero.examples.config import check_batch, load_and_check, zero_stage

CONFIGS = Path(__file__).resolve().parents[2] / "ds_configs"
ALL_FILES = sorted(CONFIGS.glob("*.json"))
HF_AUTO = [path for path in ALL_FILES if "_hf_" in path.name]  # "auto" values the Hugging Face Trainer fills in
FILES = [path for path in ALL_FILES if path not in HF_AUTO]
STAGE3 = [path for path in FILES if path.name.startswith("zero3_")]
CPU_STAGE3 = [path for path in STAGE3 if "_gpu_" not in path.name]  # GPU configs keep DeepSpeed's usual threshold


def test_the_documented_configs_are_all_there() -> None:
    names = {path.name for path in ALL_FILES}
    assert {
        "zero3_cpu_fp32.json", "zero3_gpu_bf16.json", "zero3_gpu_fp16.json", "zero3_offload_cpu.json",
        "zero3_grad_accum.json", "zero2_cpu_fp32.json", "zero3_hf_auto.json", "zero3_cpu_bf16.json",
    } <= names  # fmt: skip
    readme = (CONFIGS / "README.md").read_text()
    assert all(name in readme for name in names), "a config is missing from ds_configs/README.md"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_deepspeed_parses_it(path: Path) -> None:
    config = DeepSpeedConfig(str(path))
    assert config.zero_enabled
    assert config.zero_optimization_stage == int(path.name[4])  # zero<stage>_...
    assert config.optimizer_name is not None, "the trainer lets DeepSpeed build the optimizer from the config"
    assert config.train_batch_size == config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_batch_is_per_rank_so_any_world_size_works(path: Path) -> None:
    config = load_and_check(path, world_size=1, ort_zero_enabled=path in STAGE3)
    assert "train_batch_size" not in config
    assert zero_stage(config) == (3 if path in STAGE3 else 2)
    for world_size in (1, 2, 3, 8):
        check_batch(config, world_size, path)


@pytest.mark.parametrize("path", CPU_STAGE3, ids=lambda p: p.name)
def test_cpu_stage3_configs_really_partition(path: Path) -> None:
    config = DeepSpeedConfig(str(path))
    # The demo GPT's smallest weight matrices hold 64 * 64 elements: anything above the threshold is partitioned.
    assert config.zero_config.param_persistence_threshold <= 64 * 64


def test_the_variants_are_what_their_names_say() -> None:
    parsed = {path.stem: DeepSpeedConfig(str(path)) for path in FILES}
    assert parsed["zero3_gpu_bf16"].bfloat16_config.enabled
    assert parsed["zero3_cpu_bf16"].bfloat16_config.enabled and parsed["zero3_cpu_bf16"].optimizer_params["torch_adam"]
    assert parsed["zero3_gpu_fp16"].float16_config.enabled
    assert parsed["zero3_gpu_fp16"].float16_config.loss_scale == 0  # 0: dynamic loss scaling
    offload = parsed["zero3_offload_cpu"].zero_config
    assert offload.offload_param.device == "cpu" and offload.offload_optimizer.device == "cpu"
    assert parsed["zero3_grad_accum"].gradient_accumulation_steps == 2
    gpu_offload = parsed["zero3_gpu_bf16_offload"]
    assert gpu_offload.bfloat16_config.enabled and gpu_offload.zero_config.offload_optimizer.device == "cpu"
    for name in ("zero3_cpu_fp32", "zero3_offload_cpu", "zero3_grad_accum", "zero2_cpu_fp32"):
        assert not parsed[name].bfloat16_config.enabled and not parsed[name].float16_config.enabled
        # torch.optim.Adam: DeepSpeed's FusedAdam/CPUAdam would be compiled on first use, which a CPU box may not do.
        assert parsed[name].optimizer_params["torch_adam"] is True


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_file_selects_a_compiled_adam(path: Path) -> None:
    """DeepSpeed's "Adam"/"AdamW" is FusedAdam on CUDA (JIT-built with nvcc, which no CUDA 12 wheel on PyPI has) and
    DeepSpeedCPUAdam under offload: every file, the GPU ones included, asks for torch's Adam instead."""
    config = DeepSpeedConfig(str(path))
    assert config.optimizer_name in ("adam", "adamw")
    assert config.optimizer_params.get("torch_adam") is True


@pytest.mark.parametrize("path", HF_AUTO, ids=lambda p: p.name)
def test_hf_config_once_the_trainer_filled_it_in(path: Path, tmp_path: Path) -> None:
    """What TrainingArguments and the Trainer make of the "auto" values parses in DeepSpeed: ZeRO-3 from the
    arguments' batch size, optimizer settings and the model's hidden size, saving full weights for save_model()."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3, learning_rate=0.01, report_to=[])
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=32))
    try:
        hf_config = HfTrainerDeepSpeedConfig(str(path))
        hf_config.trainer_config_process(args)
        hf_config.trainer_config_finalize(args, model, num_training_steps=10)
        assert "auto" not in json.dumps(hf_config.config)
        config = DeepSpeedConfig(hf_config.config)
    finally:
        unset_hf_deepspeed_config()  # or later tests would build Hugging Face models under zero.Init
    assert config.zero_optimization_stage == 3 and config.train_micro_batch_size_per_gpu == 3
    assert config.optimizer_params["lr"] == 0.01 and config.optimizer_params["torch_adam"] is True
    assert config.zero_config.param_persistence_threshold == 10 * 32  # weight matrices of 32 x 32 are partitioned
    assert config.zero_config.gather_16bit_weights_on_model_save, "save_model() would write no weights"
