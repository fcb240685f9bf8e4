"""Stopping on SIGTERM (a preemption) at an optimizer-step boundary every rank agrees on, with one consistent save.

A scheduler that preempts a job sends SIGTERM, to the launcher or straight to the ranks, not always at the same
moment, and kills what still runs after its grace period (torchrun's: 30 s). transformers' `enable_jit_checkpoint`
lets each rank decide on its own timer where it saves, even from `on_pre_optimizer_step`, after DeepSpeed's engine
has already stepped inside `accelerator.backward`: the checkpoint says step N and holds the weights of N+1; and under
ZeRO-3, whose save is collective, ranks that decide at different steps run mismatched collectives (a hang, or a
checkpoint mixing two steps).

Here SIGTERM only sets a flag (ort_zero/sigterm.py). At the end of every optimizer step (where the Trainer's step count
and DeepSpeed's engine describe the same step) the ranks all-reduce it, one scalar per step: once any rank has the
signal, every rank saves that same step and stops.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

from ..foreign import transformers as transformers_internals
from ..sigterm import StopRequest
from . import checkpoints

logger = logging.getLogger(__name__)


class AgreedStopOnSigterm(TrainerCallback):
    """The Trainer's save-and-stop on SIGTERM: at the end of the optimizer step during which any rank got the signal,
    every rank asks the Trainer for its ordinary checkpoint (`checkpoint-N`, DeepSpeed's `global_stepN` in it) and
    stops training; `train()` then returns (`stopped_at` is that step)."""

    def __init__(self) -> None:
        super().__init__()
        self.request = StopRequest()
        self.stopped_at: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stopped_at = None
        self.request.install()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.request.agreed():
            control.should_save = control.should_training_stop = True
            self.stopped_at = state.global_step
            if state.is_world_process_zero:
                logger.warning(
                    "ort_zero: SIGTERM received; every rank saves checkpoint-%d and stops", state.global_step
                )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.request.uninstall()


def stop_on_sigterm(trainer: Any) -> AgreedStopOnSigterm:
    """Give `trainer` (any transformers Trainer) the agreed save-and-stop on SIGTERM, in place of transformers' JIT
    checkpoint callback if `enable_jit_checkpoint` installed it (its SIGTERM handler is given back). Idempotent."""
    present = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, AgreedStopOnSigterm)]
    if present:
        return present[0]
    transformers_internals.remove_jit_checkpoint(trainer)
    callback = AgreedStopOnSigterm()
    trainer.add_callback(callback)
    checkpoints.check_space_before_saves(trainer)  # also before this save: it stays the last callback
    return callback


def stopped_at(trainer: Any) -> int | None:
    """The step at which `trainer` saved and stopped on SIGTERM in its last `train()`, None if it did not."""
    stops = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, AgreedStopOnSigterm)]
    return stops[0].stopped_at if stops else None
