"""Users' activation checkpointing while ORTModule exports a ZeRO-3 model.

ONNX Runtime cannot run a checkpoint: a reentrant one (torch's or DeepSpeed's `CheckpointFunction`) runs the region
under no_grad and reruns it in PyTorch during the backward, which ORT's exporter refuses; a non-reentrant one is
traced as a plain call. What a checkpoint is for, ort_zero's layer-wise recompute does inside ORT's graph
(`ORTMODULE_MEMORY_OPT_LEVEL` 1 or 2): each transformer layer is recomputed in the backward, with its parameters
gathered again. So while a ZeRO-3 model is exported, a checkpoint runs its function directly when the level is 1 or
2 (announced once per process, when the export is over: ORT captures what is printed while it exports and re-logs it
on rank 0 only), and stops the run with one line when it is 0.

A checkpoint is recognised where every way of calling it arrives, so code that imported `checkpoint` by name before
anything was patched, and Hugging Face's per-layer `functools.partial(checkpoint, ...)`, are covered too:
- reentrant: torch's and DeepSpeed's `CheckpointFunction.apply`, replaced for the export (`ort_zero.patches`);
- non-reentrant: the ZeRO-3 subscriber, when a module starts its forward with torch's or DeepSpeed's checkpoint
  function on the stack (`running_checkpoint`).
ORT's own checkpoint wrappers are kept out of the way for the export (`ort_zero.patches`), so they hand every call
to torch's or DeepSpeed's checkpoint.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from .. import settings

logger = logging.getLogger(__name__)
TORCH_REENTRANT = "torch.utils.checkpoint.checkpoint(use_reentrant=True)"
DEEPSPEED = "deepspeed.checkpointing.checkpoint"
_announced = False
_pending: int | None = None  # the level to announce once the export is over


class CheckpointingRefused(SystemExit):
    """A checkpoint met while exporting a ZeRO-3 model at level 0.

    A SystemExit, so that it passes the exception handlers between the model and the user (ORT's and the exporter's
    catch Exception, wrap it and chain tracebacks), and an uncaught one prints its one-line message and exits with
    status 1, on every rank, without a traceback. The message carries its newline: Python writes an uncaught
    SystemExit's message and then a newline, two writes to unbuffered stderr, and ranks sharing the launcher's pipe
    interleaved there (measured: rank 1's line began at the end of rank 0's); a whole line in one write does not.
    """


def on_checkpoint(what: str) -> None:
    """The policy, wherever a checkpoint is recognised during a ZeRO-3 export: announce (level 1, 2) or refuse (0)."""
    global _pending
    level = settings.recompute_level()
    if level == 0:
        raise CheckpointingRefused(refusal(what) + "\n")
    _pending = level


def announce(level: int) -> None:
    """Once per process: gradient checkpointing in ORT is ort_zero's layer-wise recompute at `level`."""
    global _announced
    if _announced:
        return
    _announced = True
    logger.warning(
        "ort_zero: gradient checkpointing runs in ONNX Runtime as ort_zero's layer-wise recompute "
        "(ORTMODULE_MEMORY_OPT_LEVEL=%d): checkpointed calls are exported as plain calls, and each transformer layer "
        "is recomputed in the backward with its ZeRO-3 parameters gathered again",
        level,
    )


def announcing_after(original: Any) -> staticmethod:
    """Wraps ORTModule's export (a staticmethod): what the export met is announced once it is over."""

    @functools.wraps(original.__func__)
    def export_model(*args: Any, **kwargs: Any) -> Any:
        global _pending
        exported = original(*args, **kwargs)
        if _pending is not None:
            announce(_pending)
            _pending = None
        return exported

    return staticmethod(export_model)


def refusal(what: str) -> str:
    """One line: what the model called, why it cannot run, the two ways out (every rank says it, with its rank)."""
    rank = f" rank {torch.distributed.get_rank()}:" if torch.distributed.is_initialized() else ""
    return (
        f"ort_zero:{rank} the model calls {what} while ONNX Runtime exports it under ZeRO-3, and ORT cannot "
        "recompute a checkpoint; set ORTMODULE_MEMORY_OPT_LEVEL=1 (ort_zero's layer-wise recompute then does the "
        "checkpoint's job: each transformer layer is recomputed in the backward, its parameters gathered again), "
        "or train this model without ORTModule"
    )


def torch_checkpoint_apply(original: Any) -> classmethod:
    """Replaces torch's `CheckpointFunction.apply(function, preserve_rng_state, *args)` for an export."""

    def apply(cls: type, function: Callable[..., Any], preserve_rng_state: bool, *args: Any) -> Any:
        on_checkpoint(TORCH_REENTRANT)
        return function(*args)

    return classmethod(apply)


def deepspeed_checkpoint_apply(original: Any) -> classmethod:
    """Replaces DeepSpeed's `CheckpointFunction.apply(function, all_outputs, *args)` for an export; DeepSpeed's
    `checkpoint` returns what the function put in `all_outputs` (non-tensor outputs included)."""

    def apply(cls: type, function: Callable[..., Any], all_outputs: list[Any], *args: Any) -> Any:
        on_checkpoint(DEEPSPEED)
        outputs = function(*args)
        all_outputs.extend([outputs] if torch.is_tensor(outputs) else outputs)
        return outputs

    return classmethod(apply)


def running_checkpoint() -> str | None:
    """The checkpoint function (torch's or DeepSpeed's, however it was imported) running the caller, if any."""
    frames = _checkpoint_frames()
    frame = sys._getframe(1)
    while frame is not None:
        what = frames.get((frame.f_code.co_filename, frame.f_code.co_name))
        if what is not None:
            return what
        frame = frame.f_back
    return None


@functools.cache
def _checkpoint_frames() -> dict[tuple[str, str], str]:
    """(file, function) of the checkpoint functions: their code, not the module attributes, which ORT replaces."""
    import torch.utils.checkpoint
    from deepspeed.runtime.activation_checkpointing import checkpointing

    return {
        (torch.utils.checkpoint.__file__, "checkpoint"): "torch.utils.checkpoint.checkpoint",
        (checkpointing.__file__, "checkpoint"): DEEPSPEED,
        (checkpointing.__file__, "non_reentrant_checkpoint"): "deepspeed.checkpointing.non_reentrant_checkpoint",
    }
