"""A rank killed while a checkpoint is written (scripts/die_during_save.py: rank 1 dies half-way through its
optimizer shard of checkpoint-4, after rank 0 has gone as far as it can) leaves the previous checkpoint resumable
under ORT-ZeRO3: DeepSpeed's `latest` tag never names the half-written checkpoint, the Trainer's folder for it has no
Trainer state, and `--resume` (resume_from_checkpoint=True) continues from checkpoint-2 on the uninterrupted curve.

The job keeps no parameter persistent (`stage3_param_persistence_threshold` 0): then DeepSpeed's rank 0 has no
collective left in its save and, natively, writes `latest` naming the half-written tag (measured; ort_zero's
zero3/saving.py writes it after every rank's files).

A file of the newest checkpoint cut to half (a failed copy; rank 1's optimizer states in the default set, the model
states, the Trainer state and DeepSpeed's `latest` in the extended one): `--resume` says in one line (on each rank)
which file is damaged and resumes from the checkpoint before, onto the uninterrupted curve.

A disk that fills up (a tmpfs with room for one checkpoint as the output directory): before checkpoint-4 every rank
stops with one error naming the directory and the space needed, nothing of it written; checkpoint-2 and its `latest`
stay, and the run resumes from them once there is room.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher import free_port, remount, run_launcher, tmpfs, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "ort_zero" / "examples" / "train_hf.py"
DIE_DURING_SAVE = Path(__file__).parent / "scripts" / "die_during_save.py"
FILL_DISK_DURING_SAVE = Path(__file__).parent / "scripts" / "fill_disk_during_save.py"
CONFIG = ROOT / "ds_configs" / "zero3_hf_auto.json"
JOB = ["--max-steps", "6", "--save-steps", "2"]
TOLERANCE = 1e-5
TIMEOUT = 400
SMALL_DISK_KB = 1500  # room for checkpoint-2 (about 930 KB), not for checkpoint-4 beside it
ROOMY_DISK_KB = 4000  # room for checkpoint-2 and checkpoint-4, until another process fills it


def config_without_persistent_parameters(tmp_path: Path) -> Path:
    config = json.loads(CONFIG.read_text())
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


def output(done: subprocess.CompletedProcess) -> str:
    return (done.stdout or "") + (done.stderr or "")


def losses(out: Path) -> list[float]:
    with (out / "losses.csv").open(newline="") as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]


def launch(
    script: Path,
    folder: Path,
    *options: str,
    config: Path = CONFIG,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    argv = ["--deepspeed", str(config), "--output-dir", str(folder), *JOB, *options]
    return run_launcher(torchrun_cmd(script, argv, port=free_port()), timeout=TIMEOUT, cwd=ROOT, check=check, env=env)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The job's losses, natively, without a fault."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    launch(TRAINER, folder, "--no-ort")
    return losses(folder)


def test_a_rank_killed_while_saving_leaves_the_previous_checkpoint_to_resume_from(
    tmp_path: Path, uninterrupted: list[float]
) -> None:
    config = config_without_persistent_parameters(tmp_path)
    out = tmp_path / "ort"
    died = launch(DIE_DURING_SAVE, out, config=config, check=False)
    assert died.returncode != 0 and "die_during_save: rank 1 exits with 17" in output(died), output(died)[-3000:]
    cut, previous = out / "checkpoint-4", out / "checkpoint-2"
    half_written = cut / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    whole = previous / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    assert 0 < half_written.stat().st_size < whole.stat().st_size, "rank 1 did not die half-way through its shard"
    assert not (cut / "latest").exists(), "DeepSpeed's latest names the half-written checkpoint"
    assert not (cut / "trainer_state.json").exists(), "the cut checkpoint looks complete to the Trainer"
    assert (previous / "latest").read_text() == "global_step2" and (previous / "trainer_state.json").is_file()

    resumed = launch(TRAINER, out, "--resume", config=config)
    assert "checkpoint-4 incomplete (no trainer_state.json" in output(resumed)
    assert "resuming from checkpoint-2" in output(resumed)
    assert len(losses(out)) == len(uninterrupted) == 6
    assert losses(out) == pytest.approx(uninterrupted, abs=TOLERANCE)
    assert json.loads((out / "result.json").read_text())["steps"] == 6
    evidence = json.loads((out / "ort.json").read_text())
    assert evidence["training"]["session"], "the resumed run did not train in ORT"
    assert (cut / "trainer_state.json").is_file() and (cut / "latest").read_text() == "global_step4"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job in ORT, to its end: checkpoint-2, -4 and -6."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    launch(TRAINER, folder)
    return folder


@pytest.mark.parametrize(
    "damaged",
    [
        "global_step6/zero_pp_rank_1_mp_rank_00_optim_states.pt",
        pytest.param("global_step6/zero_pp_rank_0_mp_rank_00_model_states.pt", marks=pytest.mark.extended),
        pytest.param("trainer_state.json", marks=pytest.mark.extended),
        pytest.param("latest", marks=pytest.mark.extended),
    ],
)
def test_a_damaged_file_in_the_newest_checkpoint_is_named_and_the_one_before_resumed(
    tmp_path: Path, finished_run: Path, uninterrupted: list[float], damaged: str
) -> None:
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    path = out / "checkpoint-6" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    resumed = launch(TRAINER, out, "--resume")
    said = {line for line in output(resumed).splitlines() if f"checkpoint-6 damaged ({damaged} (" in line}
    assert len(said) == 1, output(resumed)[-3000:]  # the same line from each rank
    assert said.pop().endswith("; resuming from checkpoint-4")
    assert losses(out) == pytest.approx(uninterrupted, abs=TOLERANCE)
    assert json.loads((out / "result.json").read_text())["steps"] == 6


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with room for about one checkpoint of the job (930 KB)."""
    with tmpfs(tmp_path / "small_disk", SMALL_DISK_KB) as folder:
        yield folder


@pytest.mark.extended
@pytest.mark.parametrize("ort", [False, True], ids=["native", "ort"])
def test_a_full_disk_stops_every_rank_before_the_save_and_keeps_the_previous_checkpoint(
    small_disk: Path, uninterrupted: list[float], ort: bool
) -> None:
    out = small_disk / "run"
    mode = [] if ort else ["--no-ort"]
    full = launch(TRAINER, out, *mode, check=False)
    assert full.returncode != 0
    for rank in (0, 1):
        assert f"train_hf: error (rank {rank}): not enough space to save checkpoint-4 in {out}: it needs about" in (
            output(full)
        ), output(full)[-3000:]
    assert not (out / "checkpoint-4").exists(), "the checkpoint was begun"
    previous = out / "checkpoint-2"
    assert (previous / "latest").read_text() == "global_step2" and (previous / "trainer_state.json").is_file()

    remount(small_disk, 64 * 1024)
    launch(TRAINER, out, *mode, "--resume")
    assert losses(out) == pytest.approx(uninterrupted, abs=TOLERANCE)
    if ort:
        assert json.loads((out / "ort.json").read_text())["training"]["session"], "the run did not train in ORT"


@pytest.mark.extended
def test_a_disk_filled_by_another_process_during_the_save_ends_in_one_line(
    tmp_path: Path, uninterrupted: list[float]
) -> None:
    """Room for two checkpoints when the save begins (the check before it passes); `dd` fills the disk while rank 1
    writes checkpoint-4: rank 1 says so in one line naming the directory, checkpoint-2 stays whole, and once the
    filler is deleted `--resume` skips the partial checkpoint-4 and ends on the uninterrupted curve."""
    with tmpfs(tmp_path / "disk", ROOMY_DISK_KB) as disk:
        out, filler = disk / "run", disk / "filler"
        full = launch(FILL_DISK_DURING_SAVE, out, check=False, env={"FILL_DISK_FILLER": str(filler)})
        assert full.returncode != 0 and "fill_disk_during_save: the disk is full" in output(full), output(full)[-3000:]
        said = [line for line in output(full).splitlines() if line.startswith("train_hf: error (rank 1): ")]
        assert len(said) == 1, output(full)[-3000:]
        assert f"the disk of {out} filled while checkpoint-4 was written" in said[0]
        assert "[rank1]: Traceback" not in output(full), output(full)[-3000:]
        previous = out / "checkpoint-2"
        assert (previous / "latest").read_text() == "global_step2" and (previous / "trainer_state.json").is_file()
        assert not (out / "checkpoint-4" / "trainer_state.json").exists()
        filler.unlink()
        resumed = launch(TRAINER, out, "--resume")
        assert "checkpoint-4 incomplete" in output(resumed) and "resuming from checkpoint-2" in output(resumed)
        assert losses(out) == pytest.approx(uninterrupted, abs=TOLERANCE)
