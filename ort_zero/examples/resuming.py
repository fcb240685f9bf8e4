"""How the examples resume: `--resume` continues from the newest complete checkpoint in the output folder and stops
when there is none; `--resume auto` starts at step 0 when there is none, so the same command line serves every
attempt of a job restarted by `torchrun --max-restarts N` (the first attempt starts, later ones resume)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ort_zero.examples.rank_run import UsageError

ALWAYS, AUTO = "always", "auto"


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


def trainer_checkpoint(mode: str | None, output_dir: Path) -> str | None:
    """The Trainer's `resume_from_checkpoint` for `--resume [auto]`: the newest checkpoint-N folder every rank
    finished (None: start at step 0)."""
    if mode is None:
        return None
    from ort_zero.integrations.checkpoints import last_complete_checkpoint

    found = last_complete_checkpoint(output_dir)
    if found is None and mode == ALWAYS:
        raise UsageError(f"--resume: no complete checkpoint-N folder in {output_dir}; use --resume auto to start anew")
    return str(found) if found else None
