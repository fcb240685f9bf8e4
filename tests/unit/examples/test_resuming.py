"""The examples' resume options: `--resume` needs a complete checkpoint, `--resume auto` starts anew without one,
`--universal` needs --resume and the newest checkpoint's universal form, and a checkpoint written by another number
of ranks is refused in one line that names the conversion."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from ort_zero.examples.rank_run import UsageError
from ort_zero.examples.resuming import (
    add_resume_argument,
    check_saved_ranks,
    check_universal,
    readable_tag,
    trainer_checkpoint,
    trainer_deepspeed_config,
    universal_loading,
)


def parse(*argv: str, output_dir: Path = Path("out"), deepspeed: Path | None = Path("ds.json")) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_resume_argument(parser)
    return parser.parse_args(argv, argparse.Namespace(output_dir=output_dir, deepspeed=deepspeed))


def zero_checkpoint(folder: Path, tag: str, ranks: int) -> Path:
    (folder / tag).mkdir(parents=True)
    for rank in range(ranks):
        torch.save({}, folder / tag / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")  # reads whole
    (folder / "latest").write_text(tag)
    return folder


def test_resume_takes_auto_or_nothing() -> None:
    assert parse().resume is None and parse("--resume").resume == "always"
    assert parse("--resume", "auto").resume == "auto"
    with pytest.raises(SystemExit):
        parse("--resume", "sometimes")


def test_the_trainer_resumes_from_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    for step, complete in ((2, True), (4, False)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    newest = str(tmp_path / "checkpoint-2")
    assert trainer_checkpoint(parse("--resume", "auto", output_dir=tmp_path), 2) == newest
    assert trainer_checkpoint(parse("--resume", output_dir=tmp_path), 2) == newest
    assert trainer_checkpoint(parse(output_dir=tmp_path), 2) is None


def test_without_a_complete_checkpoint_auto_starts_anew_and_resume_stops(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-4").mkdir()  # cut short: no Trainer state
    assert trainer_checkpoint(parse("--resume", "auto", output_dir=tmp_path), 2) is None
    assert trainer_checkpoint(parse("--resume", "auto", output_dir=tmp_path / "missing"), 2) is None
    with pytest.raises(UsageError, match="no complete checkpoint-N folder .* use --resume auto to start anew"):
        trainer_checkpoint(parse("--resume", output_dir=tmp_path), 2)


def test_the_trainers_checkpoint_of_another_world_size_needs_universal(tmp_path: Path) -> None:
    zero_checkpoint(tmp_path / "checkpoint-4", "global_step4", ranks=2)
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text("{}")
    assert trainer_checkpoint(parse("--resume", output_dir=tmp_path), 2) == str(tmp_path / "checkpoint-4")
    with pytest.raises(UsageError, match="written by 2 ranks and this run has 1"):
        trainer_checkpoint(parse("--resume", output_dir=tmp_path), 1)


def test_universal_needs_resume() -> None:
    check_universal(parse("--resume", "--universal"))
    with pytest.raises(UsageError, match="--universal says how to resume: give --resume"):
        check_universal(parse("--universal"))
    with pytest.raises(UsageError, match="--universal sets the DeepSpeed config's checkpoint.load_universal"):
        check_universal(parse("--resume", "--universal", deepspeed=None))


def test_universal_loading_keeps_the_rest_of_the_config() -> None:
    config = {"train_micro_batch_size_per_gpu": 4, "checkpoint": {"tag_validation": "Warn"}}
    assert universal_loading(config) == {
        "train_micro_batch_size_per_gpu": 4, "checkpoint": {"tag_validation": "Warn", "load_universal": True}
    }  # fmt: skip
    assert "checkpoint" not in config["checkpoint"] and "load_universal" not in config["checkpoint"]


def test_the_trainer_gets_the_config_file_or_a_config_that_loads_universal_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 3}}')
    assert trainer_deepspeed_config(path, universal=False) == str(path)
    assert trainer_deepspeed_config(None, universal=False) is None
    assert trainer_deepspeed_config(path, universal=True) == {
        "zero_optimization": {"stage": 3}, "checkpoint": {"load_universal": True}
    }  # fmt: skip


def test_a_checkpoint_of_another_world_size_is_refused_with_the_conversion(tmp_path: Path) -> None:
    folder = zero_checkpoint(tmp_path, "global_step4", ranks=2)
    check_saved_ranks(folder, 2, universal=False)
    check_saved_ranks(tmp_path / "none", 1, universal=False)  # nothing to resume: nothing to check
    with pytest.raises(UsageError, match=r"written by 2 ranks and this run has 1; convert it with `ort-zero univer"):
        check_saved_ranks(folder, 1, universal=False)


def test_universal_needs_the_newest_checkpoints_conversion(tmp_path: Path) -> None:
    folder = zero_checkpoint(tmp_path, "global_step4", ranks=2)
    with pytest.raises(UsageError, match="global_step4 has no universal form yet"):
        check_saved_ranks(folder, 1, universal=True)
    (folder / "latest_universal").write_text("global_step2_universal")  # an older conversion
    with pytest.raises(UsageError, match="global_step4 has no universal form yet"):
        check_saved_ranks(folder, 1, universal=True)
    (folder / "latest_universal").write_text("global_step4_universal")
    check_saved_ranks(folder, 1, universal=True)


def test_a_damaged_newest_tag_gives_the_newest_earlier_one_that_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zero_checkpoint(tmp_path, "global_step3", ranks=2)
    zero_checkpoint(tmp_path, "global_step6", ranks=2)
    assert readable_tag(tmp_path, "train_gpt", rank=0) == "global_step6"
    cut = tmp_path / "global_step6" / "zero_pp_rank_1_mp_rank_00_model_states.pt"
    cut.write_bytes(cut.read_bytes()[:10])
    assert readable_tag(tmp_path, "train_gpt", rank=0) == "global_step3"
    said = capsys.readouterr().err.splitlines()
    assert said == [
        f"train_gpt: {tmp_path / 'global_step6'} damaged ({cut.name} (truncated or not a torch.save file: "
        "File is not a zip file)); resuming from global_step3"
    ]
    assert readable_tag(tmp_path, "train_gpt", rank=1) == "global_step3" and capsys.readouterr().err == ""


def test_no_tag_that_reads_stops_in_one_line(tmp_path: Path) -> None:
    zero_checkpoint(tmp_path, "global_step3", ranks=2)
    (tmp_path / "latest").write_text("global_step9")  # names a folder that is not there
    assert readable_tag(tmp_path, "train_gpt", rank=0) == "global_step3"
    (tmp_path / "global_step3" / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="cannot resume from .*global_step9: `latest` names global_step9"):
        readable_tag(tmp_path, "train_gpt", rank=0)
