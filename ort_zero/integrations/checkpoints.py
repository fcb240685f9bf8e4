"""Which of the Trainer's checkpoint folders a run resumes from: the newest one that every rank finished.

The Trainer writes `checkpoint-N/` in place and resumes (`resume_from_checkpoint=True`) from the highest N, finished
or not: a rank lost while saving leaves a folder that `get_last_checkpoint` picks and DeepSpeed cannot load. In
ORTZeroTrainer every rank has written its files before rank 0 writes the Trainer state, the folder's last file
(`ORTZeroTrainer._save_rng_state`); so a folder with it is complete, and one without it was cut short. A complete
folder whose files no longer read whole (a truncated copy, bit rot: checkpoint_files.py) is skipped too. Before each
save the ranks agree that the disk has room for it (`SpaceBeforeSave`, ort_zero/disk_space.py).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .. import disk_space
from .checkpoint_files import damaged_file

logger = logging.getLogger(__name__)
_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def is_complete(folder: Path) -> bool:
    return (folder / TRAINER_STATE_NAME).is_file()


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """The Trainer's `checkpoint-N` folders in `output_dir`, newest (highest N) first."""
    root = Path(output_dir)
    steps = {path: _CHECKPOINT.match(path.name) for path in root.iterdir()} if root.is_dir() else {}
    found = [(int(match.group(1)), path) for path, match in steps.items() if match and path.is_dir()]
    return [path for _, path in sorted(found, reverse=True)]


class DamagedCheckpoint(ValueError):
    """A checkpoint chosen to resume from has a file that does not read whole; the message names it."""


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder in `output_dir` whose files all read (None if there is none); the
    newer ones skipped are named in one warning, with why."""
    skipped: list[str] = []
    for folder in checkpoint_folders(output_dir):
        fault = why_not_resumable(folder)
        if fault is None:
            if skipped:
                logger.warning("ort_zero: %s; resuming from %s", "; ".join(skipped), folder.name)
            return folder
        skipped.append(f"{folder.name} {fault}")
    return None


def why_not_resumable(folder: Path) -> str | None:
    """Why a run cannot resume from `folder` ("incomplete (...)", "damaged (...)"); None if it can."""
    if not is_complete(folder):
        return f"incomplete (no {TRAINER_STATE_NAME}: a rank stopped while saving it)"
    damage = damaged_file(folder)
    return f"damaged ({damage})" if damage is not None else None


def require_readable(folder: Path) -> None:
    """Raise `DamagedCheckpoint` naming the file of `folder` that does not read whole, if one does not."""
    damage = damaged_file(folder) if folder.is_dir() else None
    if damage is not None:
        raise DamagedCheckpoint(
            f"cannot resume from {folder}: {damage}; resume from an older checkpoint, or with "
            "resume_from_checkpoint=True (--resume) from the newest whose files all read"
        )


class SpaceBeforeSave(TrainerCallback):
    """Before the Trainer saves at a step's or an epoch's end, every rank checks that the output directory has room for
    the checkpoint (the size of the newest complete one, or an estimate from the model); if not, every rank raises
    `disk_space.NotEnoughSpace` before anything is written. Runs after the callbacks that decide to save."""

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if control.should_save:
            self.require_space(args, state, model)

    def on_epoch_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if control.should_save:
            self.require_space(args, state, model)

    @staticmethod
    def require_space(args: Any, state: Any, model: Any) -> None:
        previous = next((folder for folder in checkpoint_folders(args.output_dir) if is_complete(folder)), None)
        needed = disk_space.folder_bytes(previous) if previous else disk_space.estimated_checkpoint_bytes(model)
        disk_space.require_space(Path(args.output_dir), needed, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")


def check_space_before_saves(trainer: Any) -> None:
    """`SpaceBeforeSave` as `trainer`'s last callback (after those that set `should_save`); idempotent."""
    trainer.remove_callback(SpaceBeforeSave)
    trainer.add_callback(SpaceBeforeSave)
