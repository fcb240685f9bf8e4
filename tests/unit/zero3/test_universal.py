"""The universal-checkpoint conversion's input checks: how many ranks wrote a checkpoint, and one-line refusals of
a folder that holds none (the conversion itself runs in tests/distributed/test_resize.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ort_zero.cli.main import main
from ort_zero.zero3.universal import UniversalCheckpointError, convert_to_universal, latest_tag, saved_world_size


def test_the_ranks_are_counted_from_their_model_states(tmp_path: Path) -> None:
    for rank in (0, 1, 2):
        (tmp_path / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_bytes(b"")
        (tmp_path / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
    assert saved_world_size(tmp_path) == 3
    assert latest_tag(tmp_path) is None


def test_a_folder_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UniversalCheckpointError, match="no 'latest' file naming a checkpoint; pass its tag"):
        convert_to_universal(tmp_path)
    (tmp_path / "latest").write_text("global_step4")
    (tmp_path / "global_step4").mkdir()
    with pytest.raises(UniversalCheckpointError, match=r"global_step4 is not a DeepSpeed ZeRO checkpoint"):
        convert_to_universal(tmp_path)
    assert not (tmp_path / "latest_universal").exists()


def test_the_command_says_it_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["universal-checkpoint", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("ort-zero universal-checkpoint: error: ") and "\n" not in error
