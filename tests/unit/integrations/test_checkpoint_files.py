"""Each way a checkpoint's file stops reading whole, made with real files: torch.save's archives cut short or with a
changed byte, JSON cut short, DeepSpeed's `latest` naming nothing, a safetensors file cut short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ort_zero.integrations.checkpoint_files import damaged_file


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A checkpoint folder as the Trainer and DeepSpeed write it, every file readable."""
    folder = tmp_path / "checkpoint-10"
    (folder / "global_step10").mkdir(parents=True)
    torch.save({"module": torch.arange(1024.0)}, folder / "global_step10" / "mp_rank_00_model_states.pt")
    torch.save({"state": torch.ones(2048)}, folder / "global_step10" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    (folder / "latest").write_text("global_step10")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    save_file({"weight": torch.zeros(64)}, folder / "model.safetensors")
    return folder


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_whole_checkpoint_reads(checkpoint: Path) -> None:
    assert damaged_file(checkpoint) is None


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("global_step10/zero_pp_rank_1_mp_rank_00_optim_states.pt", "truncated or not a torch.save file"),
        ("global_step10/mp_rank_00_model_states.pt", "truncated or not a torch.save file"),
        ("trainer_state.json", "not valid JSON"),
        ("model.safetensors", "truncated: 164 bytes, its header says 328"),
    ],
)
def test_a_file_cut_short_is_named(checkpoint: Path, name: str, why: str) -> None:
    cut(checkpoint / name)
    found = damaged_file(checkpoint)
    assert found is not None and found.startswith(f"{name} ({why}"), found


def test_a_changed_byte_fails_its_crc(checkpoint: Path) -> None:
    path = checkpoint / "global_step10" / "mp_rank_00_model_states.pt"
    data = bytearray(path.read_bytes())
    at = data.index(torch.arange(1024.0).numpy().tobytes())  # inside the tensor's stored bytes
    data[at + 100] ^= 0xFF
    path.write_bytes(bytes(data))
    found = damaged_file(checkpoint)
    assert found is not None and "fails its CRC" in found, found


def test_latest_naming_a_missing_tag_is_named(checkpoint: Path) -> None:
    (checkpoint / "latest").write_text("global_step12")
    assert damaged_file(checkpoint) == "latest (names 'global_step12', which is not a folder beside it)"
