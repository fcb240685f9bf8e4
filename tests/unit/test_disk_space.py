"""Room for a checkpoint (ort_zero/disk_space.py): what it needs, and the refusal before anything is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ort_zero.disk_space import (
    NotEnoughSpace,
    deepspeed_checkpoint_bytes,
    estimated_checkpoint_bytes,
    folder_bytes,
    require_space,
)


def test_a_short_disk_is_refused_naming_the_directory_and_the_space_needed(tmp_path: Path) -> None:
    target = tmp_path / "out" / "checkpoint-4"  # not there yet: the nearest existing folder's disk counts
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(NotEnoughSpace, match=rf"save checkpoint-4 in {target}: it needs about [\d.]+ MiB, [\d.]+ MiB"):
        require_space(target, 2 * free, "checkpoint-4")
    require_space(target, 1024, "checkpoint-4")
    assert not target.exists()


def test_the_first_checkpoint_is_estimated_from_the_model() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 2))  # 110 and 22 parameters
    model[1].requires_grad_(False)  # frozen: its weights only, no optimizer state
    assert estimated_checkpoint_bytes(model) == 110 * (4 + 12) + 22 * 4


def test_a_later_checkpoint_needs_what_the_previous_one_took(tmp_path: Path) -> None:
    model = torch.nn.Linear(10, 10)
    assert deepspeed_checkpoint_bytes(tmp_path, model) == estimated_checkpoint_bytes(model)
    (tmp_path / "global_step2").mkdir()
    (tmp_path / "global_step2" / "optim_states.pt").write_bytes(b"x" * 5000)
    (tmp_path / "global_step2" / "model_states.pt").write_bytes(b"x" * 300)
    (tmp_path / "latest").write_text("global_step2")
    assert deepspeed_checkpoint_bytes(tmp_path, model) == folder_bytes(tmp_path / "global_step2") == 5300
