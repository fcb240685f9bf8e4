"""Which checkpoint folder ORTZeroTrainer resumes from: the newest complete one (it has the Trainer state) whose files
all read (a truncated torch.save file, written here by torch.save and cut, is skipped)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from ort_zero import disk_space
from ort_zero.integrations.checkpoints import (
    DamagedCheckpoint,
    SpaceBeforeSave,
    checkpoint_folders,
    last_complete_checkpoint,
    require_readable,
)


def make(root: Path, name: str, complete: bool) -> Path:
    folder = root / name
    (folder / "global_step").mkdir(parents=True)
    if complete:
        (folder / "trainer_state.json").write_text("{}")
    return folder


def test_folders_are_ordered_by_step_number_and_other_names_are_ignored(tmp_path: Path) -> None:
    for name in ("checkpoint-9", "checkpoint-10", "checkpoint-2", "checkpoint-4.bak", "tmp-checkpoint-12"):
        make(tmp_path, name, complete=True)
    (tmp_path / "checkpoint-11").write_text("a file, not a folder")
    assert [p.name for p in checkpoint_folders(tmp_path)] == ["checkpoint-10", "checkpoint-9", "checkpoint-2"]


def test_newest_complete_checkpoint_is_chosen_and_the_skipped_ones_are_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make(tmp_path, "checkpoint-2", complete=True)
    expected = make(tmp_path, "checkpoint-4", complete=True)
    make(tmp_path, "checkpoint-6", complete=False)
    make(tmp_path, "checkpoint-8", complete=False)
    with caplog.at_level(logging.WARNING, logger="ort_zero"):
        assert last_complete_checkpoint(tmp_path) == expected
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 1 and "checkpoint-8 incomplete (no trainer_state.json" in said[0], said
    assert "; checkpoint-6 incomplete" in said[0] and said[0].endswith("; resuming from checkpoint-4")


def truncate_optimizer_states(folder: Path) -> str:
    """A rank's optimizer states as torch.save writes them, then cut to half (a failed copy); its path in `folder`."""
    path = folder / "global_step" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": torch.arange(4096.0)}, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return str(path.relative_to(folder))


def test_a_damaged_newest_checkpoint_is_skipped_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    expected = make(tmp_path, "checkpoint-5", complete=True)
    damaged = truncate_optimizer_states(make(tmp_path, "checkpoint-10", complete=True))
    with caplog.at_level(logging.WARNING, logger="ort_zero"):
        assert last_complete_checkpoint(tmp_path) == expected
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 1 and f"checkpoint-10 damaged ({damaged} (truncated" in said[0], said
    assert said[0].endswith("; resuming from checkpoint-5")


def test_choosing_a_damaged_checkpoint_stops_naming_the_file(tmp_path: Path) -> None:
    folder = make(tmp_path, "checkpoint-10", complete=True)
    require_readable(folder)  # every file reads
    damaged = truncate_optimizer_states(folder)
    with pytest.raises(DamagedCheckpoint, match=f"cannot resume from {folder}: {damaged} \\(truncated") as raised:
        require_readable(folder)
    assert "\n" not in str(raised.value)


def test_the_newest_folder_is_chosen_silently_when_it_is_complete(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make(tmp_path, "checkpoint-2", complete=False)  # older incomplete folders do not matter
    expected = make(tmp_path, "checkpoint-4", complete=True)
    with caplog.at_level(logging.WARNING, logger="ort_zero"):
        assert last_complete_checkpoint(tmp_path) == expected
    assert caplog.text == ""


def test_no_complete_checkpoint_gives_none(tmp_path: Path) -> None:
    assert last_complete_checkpoint(tmp_path / "missing") is None
    make(tmp_path, "checkpoint-2", complete=False)
    assert last_complete_checkpoint(tmp_path) is None


def test_the_room_for_a_save_is_what_the_newest_complete_checkpoint_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(tmp_path, "checkpoint-2", complete=True)
    (tmp_path / "checkpoint-2" / "global_step" / "optim_states.pt").write_bytes(b"x" * 4000)
    make(tmp_path, "checkpoint-4", complete=False)  # cut short: not a measure
    asked: list[tuple[Path, int, str]] = []
    monkeypatch.setattr(disk_space, "require_space", lambda *request: asked.append(request))
    args, state = TrainingArguments(output_dir=str(tmp_path), report_to=[]), TrainerState(global_step=6)
    SpaceBeforeSave().on_step_end(args, state, TrainerControl(should_save=False), model=None)
    assert asked == []
    SpaceBeforeSave().on_step_end(args, state, TrainerControl(should_save=True), model=None)
    assert asked == [(tmp_path, 4000 + len("{}"), "checkpoint-6")]
