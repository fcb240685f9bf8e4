"""Room for a checkpoint, agreed by every rank before any of them writes a byte of it.

A disk that fills while a ZeRO-3 checkpoint is written stops the rank that hits it in the middle of a collective
save: the others wait for it until the collective timeout, or lose contact with it, and the checkpoint is left half
written. So before a save every rank measures the free space where the checkpoint goes, the ranks take the smallest
figure (one all-reduce; ranks on other nodes may write to other disks) and, if it is short of what the checkpoint needs,
every rank stops with the same one-line error before anything is written. What a checkpoint needs is the size of the
previous one of the same run (the same shapes), or, for a run's first, an estimate from the model (its weights, and
Adam's fp32 weights and two moments for what trains). A disk filled by someone else during the save is still possible:
torch.save then says `iostream error` or `unexpected pos`, never that the disk is full; `saving_into` turns that into
one line naming the directory. The previous checkpoint and DeepSpeed's `latest` stay as they were (zero3/saving.py
writes `latest` last).
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from .sigterm import collective_device

ADAM_FP32_COPIES = 3  # ZeRO's fp32 master weights and Adam's two moments, per trained parameter
HEADROOM = 1.05  # files' metadata and the small files (RNG states, scheduler, configs) the estimate leaves out
FULL_BYTES = 2**20  # a failed write with less than this free where it went: the disk filled


class NotEnoughSpace(OSError):
    """The disk a checkpoint goes to has less free space than the checkpoint needs; raised on every rank."""


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under `folder`."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def estimated_checkpoint_bytes(model: torch.nn.Module) -> int:
    """A ZeRO-3 checkpoint of `model` with Adam, over all ranks: the weights once, and fp32 weights and two moments
    for every trained parameter (ZeRO-3 parameters counted whole, `ds_numel`)."""
    total = 0
    for param in model.parameters():
        numel = getattr(param, "ds_numel", param.numel())
        total += numel * param.element_size() + (numel * 4 * ADAM_FP32_COPIES if param.requires_grad else 0)
    return total


def deepspeed_checkpoint_bytes(save_dir: Path, model: torch.nn.Module) -> int:
    """What the next `engine.save_checkpoint(save_dir)` needs: the size of the tag `latest` names, else an estimate."""
    latest = save_dir / "latest"
    previous = save_dir / latest.read_text().strip() if latest.is_file() else None
    return folder_bytes(previous) if previous and previous.is_dir() else estimated_checkpoint_bytes(model)


class DiskFilledDuringSave(NotEnoughSpace):
    """A write of a checkpoint failed because the disk filled while it was written; raised on the rank that hit it."""


@contextlib.contextmanager
def saving_into(directory: Path, what: str) -> Iterator[None]:
    """A save of `what` into `directory` that fails because the disk there is full raises `DiskFilledDuringSave`,
    one line naming the directory, in place of torch's words (`iostream error`, `unexpected pos`)."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        if isinstance(error, NotEnoughSpace):
            raise
        free = shutil.disk_usage(nearest_existing(directory)).free
        if free >= FULL_BYTES and getattr(error, "errno", None) != errno.ENOSPC:
            raise
        said = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise DiskFilledDuringSave(
            f"the disk of {directory} filled while {what} was written ({megabytes(free)} free; torch said: {said}); "
            f"the previous checkpoint is intact: free space there, delete the partial {what} and resume"
        ) from error


def nearest_existing(directory: Path) -> Path:
    """`directory`, or the nearest folder above it that exists."""
    return next(folder for folder in (directory, *directory.parents) if folder.exists())


def require_space(directory: Path, needed: int, what: str) -> None:
    """Raise NotEnoughSpace on every rank when `directory` (or the nearest folder of it that exists) has less than
    `needed` bytes free on any rank (the largest `needed` any rank names). A collective: every rank calls it before
    the same save."""
    free = shutil.disk_usage(nearest_existing(directory)).free
    if dist.is_available() and dist.is_initialized():
        figures = torch.tensor([needed, -free], dtype=torch.int64, device=collective_device())
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        needed, free = int(figures[0].item()), -int(figures[1].item())
    needed = int(needed * HEADROOM)
    if free < needed:
        raise NotEnoughSpace(
            f"not enough space to save {what} in {directory}: it needs about {megabytes(needed)}, "
            f"{megabytes(free)} free (the smallest any rank sees); free space there or save elsewhere, nothing of "
            "it was written and the previous checkpoint is intact"
        )


def megabytes(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
