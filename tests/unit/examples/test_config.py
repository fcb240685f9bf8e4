"""ort_zero.examples.config: every bad config is one clear ConfigError naming the file, before DeepSpeed runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ort_zero.examples.config import ConfigError, check_batch, check_zero_stage, load_and_check, load_config

STAGE3 = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ds.json"
    path.write_text(text)
    return path


def test_loads_a_json_object(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, json.dumps(STAGE3))) == STAGE3


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not found: .*nope\.json"):
        load_config(tmp_path / "nope.json")


def test_malformed_json_names_the_path_and_the_position(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "train_micro_batch_size_per_gpu": 2,\n}\n')
    with pytest.raises(ConfigError, match=r"ds\.json is not valid JSON: .* line 3 column 1"):
        load_config(path)


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must hold a JSON object, found list"):
        load_config(write(tmp_path, "[1, 2]"))


@pytest.mark.parametrize("stage", [0, 1, 2, None])
def test_ort_zero_needs_stage_3(stage: int | None) -> None:
    config = {"zero_optimization": {"stage": stage}} if stage is not None else {}
    with pytest.raises(ConfigError, match="ort_zero needs ZeRO stage 3.*--native"):
        check_zero_stage(config, ort_zero_enabled=True, path="x.json")
    check_zero_stage(config, ort_zero_enabled=False, path="x.json")  # --native runs any stage


def test_stage_3_passes() -> None:
    check_zero_stage(STAGE3, ort_zero_enabled=True)


def test_global_batch_must_divide_by_the_world_size() -> None:
    config = {"train_batch_size": 6}
    check_batch(config, 3)
    with pytest.raises(ConfigError, match="train_batch_size 6 is not divisible by the world size 4"):
        check_batch(config, 4)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}, "!="),
        ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 3}, "not a multiple of train_micro"),
        ({"train_batch_size": 8, "gradient_accumulation_steps": 3}, "not a multiple of gradient_accumulation"),
        ({"gradient_accumulation_steps": 2}, "set train_micro_batch_size_per_gpu"),
        ({"train_micro_batch_size_per_gpu": 0}, "must be a positive integer"),
        ({"train_micro_batch_size_per_gpu": "4"}, "must be a positive integer"),
    ],
)
def test_inconsistent_batch_settings(config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_batch(config, 2)


def test_per_rank_batch_settings_work_at_any_world_size() -> None:
    for world_size in (1, 2, 7):
        check_batch({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, world_size)


def test_load_and_check_runs_every_check(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps({**STAGE3, "train_batch_size": 4}))
    assert load_and_check(path, world_size=2) == {**STAGE3, "train_batch_size": 4}
    with pytest.raises(ConfigError, match="not divisible"):
        load_and_check(path, world_size=3)
