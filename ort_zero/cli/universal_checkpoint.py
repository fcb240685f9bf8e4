"""`ort-zero universal-checkpoint CHECKPOINT_DIR`: make a ZeRO-3 checkpoint loadable on another number of ranks.

CHECKPOINT_DIR is the folder `engine.save_checkpoint` wrote into (the one holding DeepSpeed's `latest`; for the
Trainer, `checkpoint-N/`). Writes `<tag>_universal/` beside the tag and names it in `latest_universal`; resume with
`"checkpoint": {"load_universal": true}` in the DeepSpeed config (the examples: `--resume --universal`).
Exit status: 0 converted, 2 bad input or a failed conversion.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_dir", type=Path, metavar="CHECKPOINT_DIR", help="the folder holding 'latest'")
    parser.add_argument("--tag", default=None, help="the checkpoint to convert (default: the one 'latest' names)")


def run(args: argparse.Namespace) -> int:
    from ort_zero.zero3.universal import UniversalCheckpointError, convert_to_universal

    try:
        target = convert_to_universal(args.checkpoint_dir, args.tag)
    except UniversalCheckpointError as error:
        print(f"ort-zero universal-checkpoint: error: {error}", file=sys.stderr)
        return 2
    print(f"{target}: loads on any number of ranks (named in {args.checkpoint_dir / 'latest_universal'})")
    return 0
