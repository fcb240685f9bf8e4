"""How the examples resume: `--resume` continues from the newest complete checkpoint in the output folder and stops
when there is none; `--resume auto` starts at step 0 when there is none, so the same command line serves every
attempt of a job restarted by `torchrun --max-restarts N` (the first attempt starts, later ones resume).
`--universal` loads the checkpoint's universal form (`ort-zero universal-checkpoint`) on any number of ranks."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from ort_zero.examples.rank_run import UsageError
from ort_zero.integrations.checkpoint_files import damaged_file
from ort_zero.zero3.universal import LATEST_UNIVERSAL, UNIVERSAL_SUFFIX, latest_tag, saved_world_size

ALWAYS, AUTO = "always", "auto"
STEP_TAG = re.compile(r"^global_step(\d+)$")  # DeepSpeed's default tag


def add_resume_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume",
        nargs="?",
        const=ALWAYS,
        choices=(ALWAYS, AUTO),
        default=None,
        help="continue from the newest complete checkpoint in --output-dir (an error when there is none); "
        "'--resume auto': start at step 0 when there is none (for torchrun --max-restarts)",
    )
    parser.add_argument(
        "--universal",
        action="store_true",
        help="with --resume: load the universal checkpoint `ort-zero universal-checkpoint` made, on any number of "
        "ranks (keep the global batch: gradient accumulation x ranks)",
    )


def check_universal(args: Any) -> None:
    if args.universal and args.resume is None:
        raise UsageError("--universal says how to resume: give --resume (or --resume auto) too")
    if args.universal and getattr(args, "deepspeed", True) is None:
        raise UsageError("--universal sets the DeepSpeed config's checkpoint.load_universal: give --deepspeed CONFIG")


def universal_loading(config: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed config with `checkpoint.load_universal` on: `load_checkpoint` reads `latest_universal`."""
    return {**config, "checkpoint": {**config.get("checkpoint", {}), "load_universal": True}}


def check_saved_ranks(checkpoint_dir: Path, world_size: int, universal: bool) -> None:
    """A ZeRO checkpoint loads only on the number of ranks that wrote it (DeepSpeed's load refuses another with a
    traceback, "Automatic adjustment ... not currently supported"); its universal form loads anywhere, if it is the
    newest checkpoint's. Said before the engine is built, with the way out."""
    tag = latest_tag(checkpoint_dir)
    if tag is None:
        return
    convert = f"convert it with `ort-zero universal-checkpoint {checkpoint_dir}`"
    if universal:
        if latest_tag(checkpoint_dir, LATEST_UNIVERSAL) != f"{tag}{UNIVERSAL_SUFFIX}":
            raise UsageError(f"--universal: {checkpoint_dir}/{tag} has no universal form yet; {convert}")
        return
    saved = saved_world_size(checkpoint_dir / tag) if (checkpoint_dir / tag).is_dir() else 0
    if saved and saved != world_size:
        raise UsageError(
            f"{checkpoint_dir / tag} was written by {saved} ranks and this run has {world_size}; {convert} and "
            "resume with --universal"
        )


def trainer_checkpoint(args: Any, world_size: int) -> str | None:
    """The Trainer's `resume_from_checkpoint` for `--resume [auto] [--universal]` (args: resume, universal,
    output_dir, deepspeed): the newest checkpoint-N folder every rank finished (None: start at step 0), checked for
    this world size (`check_saved_ranks`)."""
    check_universal(args)
    if args.resume is None:
        return None
    from ort_zero.integrations.checkpoints import last_complete_checkpoint

    found = last_complete_checkpoint(args.output_dir)
    if found is None and args.resume == ALWAYS:
        raise UsageError(
            f"--resume: no complete checkpoint-N folder in {args.output_dir}; use --resume auto to start anew"
        )
    if found is not None:
        check_saved_ranks(found, world_size, args.universal)
    return str(found) if found else None


def trainer_deepspeed_config(path: Path | None, universal: bool) -> str | dict[str, Any] | None:
    """TrainingArguments' `deepspeed`: the config file, or with --universal the config loading universal checkpoints
    (None: accelerate's DeepSpeed plugin configures it)."""
    if path is None or not universal:
        return str(path) if path else None
    from ort_zero.examples.config import load_config

    return universal_loading(load_config(path))


def readable_tag(checkpoint_dir: Path, program: str, rank: int) -> str | None:
    """The DeepSpeed tag in `checkpoint_dir` to resume from: the one `latest` names if its files all read whole, else
    the newest `global_stepN` whose files do, written by as many ranks (rank 0 says so in one line naming the damaged
    file); None without `latest`. A UsageError naming the file when no tag reads."""
    tag = latest_tag(checkpoint_dir)
    if tag is None:
        return None
    named = checkpoint_dir / tag
    damage = damaged_file(named) if named.is_dir() else f"`latest` names {tag}, which is not a folder"
    if damage is None:
        return tag
    ranks = saved_world_size(named) if named.is_dir() else 0
    for older in tags_newest_first(checkpoint_dir):
        saved_by = saved_world_size(older)
        if older != named and saved_by and saved_by == (ranks or saved_by) and damaged_file(older) is None:
            if rank == 0:
                print(f"{program}: {named} damaged ({damage}); resuming from {older.name}", file=sys.stderr)
            return older.name
    raise UsageError(f"cannot resume from {named}: {damage}, and no other checkpoint in {checkpoint_dir} reads whole")


def tags_newest_first(checkpoint_dir: Path) -> list[Path]:
    """DeepSpeed's `global_stepN` folders in `checkpoint_dir`, highest N first."""
    steps = {int(m.group(1)): path for path in checkpoint_dir.iterdir() if (m := STEP_TAG.match(path.name))}
    return [steps[step] for step in sorted(steps, reverse=True)]
