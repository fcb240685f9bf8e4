"""Resuming a ZeRO-3 checkpoint on another number of ranks, through DeepSpeed's universal checkpoint.

A ZeRO-3 checkpoint holds one partition per rank (`zero_pp_rank_<r>_mp_rank_00_*_states.pt`) and DeepSpeed loads it
only on the number of ranks that wrote it. DeepSpeed's converter (`python -m deepspeed.checkpoint.ds_to_universal`)
rewrites it per parameter (weights and the optimizer's moments, whole); an engine whose config says
`"checkpoint": {"load_universal": true}` loads that on any number of ranks, from the tag `latest_universal` names.
It works with ort_zero's hooks, in ORT and in PyTorch, 2 ranks to 1 and 1 to 2 (tests/distributed/test_resize.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

LATEST, LATEST_UNIVERSAL = "latest", "latest_universal"
UNIVERSAL_SUFFIX = "_universal"
_RANK_FILE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt$")


class UniversalCheckpointError(RuntimeError):
    """A checkpoint that cannot be converted; the message names it and why."""


def latest_tag(checkpoint_dir: Path, pointer: str = LATEST) -> str | None:
    """The tag DeepSpeed's `latest` (or `latest_universal`) file names in `checkpoint_dir`; None without one."""
    path = Path(checkpoint_dir) / pointer
    return path.read_text().strip() if path.is_file() else None


def saved_world_size(tag_dir: Path) -> int:
    """How many ranks wrote the ZeRO checkpoint in `tag_dir` (0 when it holds no rank's model states)."""
    ranks = {int(match.group(1)) for path in Path(tag_dir).iterdir() if (match := _RANK_FILE.match(path.name))}
    return len(ranks)


def convert_to_universal(checkpoint_dir: Path, tag: str | None = None) -> Path:
    """Convert the checkpoint `tag` in `checkpoint_dir` (DeepSpeed's `latest` when None) into `<tag>_universal`
    beside it and name that in `latest_universal`, last (an interrupted conversion leaves the previous one named).
    Returns the universal checkpoint's folder."""
    checkpoint_dir = Path(checkpoint_dir)
    tag = tag or latest_tag(checkpoint_dir)
    if tag is None:
        raise UniversalCheckpointError(f"{checkpoint_dir}: no '{LATEST}' file naming a checkpoint; pass its tag")
    source, target = checkpoint_dir / tag, checkpoint_dir / f"{tag}{UNIVERSAL_SUFFIX}"
    if not source.is_dir() or saved_world_size(source) == 0:
        raise UniversalCheckpointError(f"{source} is not a DeepSpeed ZeRO checkpoint (no *_model_states.pt)")
    shutil.rmtree(target, ignore_errors=True)  # what an interrupted conversion left
    converter = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal"]
    done = subprocess.run(
        [*converter, "--input_folder", str(source), "--output_folder", str(target)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UniversalCheckpointError(f"DeepSpeed's ds_to_universal failed on {source}: {last}")
    (checkpoint_dir / LATEST_UNIVERSAL).write_text(target.name)
    return target
