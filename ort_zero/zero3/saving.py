"""A DeepSpeed checkpoint's `latest` tag, written only once every rank has written its part of the checkpoint.

DeepSpeed's `save_checkpoint` has global rank 0 write `latest` as soon as rank 0's own files are written; another
rank still writing its shard (or killed while writing it) leaves `latest` naming a half-written tag, and
`load_checkpoint` then fails on it. Measured on DeepSpeed 0.19.8 with a rank killed mid-shard: only ZeRO-3's
collective for persistent parameters, when a model has any, happens to hold rank 0 back. Here `latest` follows
DeepSpeed's own closing barrier and is replaced atomically, so it always names a tag that every rank completed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

LATEST = "latest"  # the file DeepSpeed's load_checkpoint reads the tag from


def save_checkpoint_latest_last(save_checkpoint: Callable[..., Any]) -> Callable[..., Any]:
    """DeepSpeedEngine.save_checkpoint writing `latest` after every rank's files (same arguments and result)."""

    def save_with_latest_last(
        engine: Any,
        save_dir: str,
        tag: Any = None,
        client_state: dict | None = None,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> Any:
        client_state = {} if client_state is None else client_state
        if not save_latest or engine.checkpoint_engine.is_decoupled():  # a decoupled engine commits on its own
            return save_checkpoint(engine, save_dir, tag, client_state, save_latest, exclude_frozen_parameters)
        tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"  # DeepSpeed's default tag
        saved = save_checkpoint(engine, save_dir, tag, client_state, False, exclude_frozen_parameters)
        # save_checkpoint ended with a barrier: every rank has written its files of `tag`
        if engine.global_rank == 0:
            write_atomically(Path(save_dir) / LATEST, tag)
        dist.barrier()
        return saved

    return save_with_latest_last


def write_atomically(path: Path, text: str) -> None:
    """`path` holds the old text or the new one, never a part: written beside it, then renamed over it."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)
