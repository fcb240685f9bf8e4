"""Load and check a DeepSpeed JSON config before DeepSpeed sees it.

DeepSpeed reports a bad config as an assertion deep inside `deepspeed.initialize`, on every rank, after the process
group is up. Checking here first turns each mistake into one message that names the file and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A DeepSpeed config this run cannot use; the message says which file and why."""


def load_config(path: str | Path) -> dict[str, Any]:
    """Parse the JSON file at `path` into a dict; ConfigError if it is missing, unreadable or not a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"DeepSpeed config not found: {path} (`ort-zero configs` lists the ones ort_zero ships)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"DeepSpeed config {path} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read DeepSpeed config {path}: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"DeepSpeed config {path} must hold a JSON object, found {type(config).__name__}")
    return config


def zero_stage(config: dict[str, Any]) -> int:
    """The ZeRO stage the config asks for (DeepSpeed's default is 0: no ZeRO)."""
    section = config.get("zero_optimization", {})
    return section.get("stage", 0) if isinstance(section, dict) else 0


def _positive_int(config: dict[str, Any], key: str, path: Path | str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{path}: {key} must be a positive integer, found {value!r}")
    return value


def check_batch(config: dict[str, Any], world_size: int, path: Path | str = "<config>") -> None:
    """The batch settings must be consistent for this world size.

    `train_batch_size` is global, so the world size must divide it; configs written with
    `train_micro_batch_size_per_gpu` and `gradient_accumulation_steps` alone work at any world size.
    """
    global_batch = _positive_int(config, "train_batch_size", path)
    micro = _positive_int(config, "train_micro_batch_size_per_gpu", path)
    accumulation = _positive_int(config, "gradient_accumulation_steps", path)
    if global_batch is None and micro is None:
        raise ConfigError(f"{path}: set train_micro_batch_size_per_gpu (or train_batch_size)")
    if global_batch is None:
        return
    if global_batch % world_size:
        raise ConfigError(
            f"{path}: train_batch_size {global_batch} is not divisible by the world size {world_size}; "
            "set train_micro_batch_size_per_gpu and gradient_accumulation_steps instead, which scale with it"
        )
    per_rank = global_batch // world_size
    if micro is not None and accumulation is not None and micro * accumulation != per_rank:
        raise ConfigError(
            f"{path}: train_batch_size {global_batch} != train_micro_batch_size_per_gpu {micro} x "
            f"gradient_accumulation_steps {accumulation} x world size {world_size}"
        )
    if micro is not None and per_rank % micro:
        raise ConfigError(
            f"{path}: train_batch_size {global_batch} / world size {world_size} is not a multiple of "
            f"train_micro_batch_size_per_gpu {micro}"
        )
    if accumulation is not None and per_rank % accumulation:
        raise ConfigError(
            f"{path}: train_batch_size {global_batch} / world size {world_size} is not a multiple of "
            f"gradient_accumulation_steps {accumulation}"
        )


def check_zero_stage(config: dict[str, Any], *, ort_zero_enabled: bool, path: Path | str = "<config>") -> None:
    """ort_zero replaces ZeRO-3's hooks only: with it enabled the config must ask for stage 3."""
    stage = zero_stage(config)
    if ort_zero_enabled and stage != 3:
        raise ConfigError(
            f"{path}: zero_optimization.stage is {stage!r}, but ort_zero needs ZeRO stage 3; "
            "use a stage-3 config, or --native to run this config in plain DeepSpeed"
        )


def load_and_check(path: str | Path, *, world_size: int = 1, ort_zero_enabled: bool = True) -> dict[str, Any]:
    """`load_config`, then every check; the one entry point for tools that take a `--deepspeed_config`."""
    config = load_config(path)
    check_zero_stage(config, ort_zero_enabled=ort_zero_enabled, path=path)
    check_batch(config, world_size, path)
    return config
