"""transformers' internals that ort_zero reads (transformers `versions.TRANSFORMERS_VERSIONS`).

Read: a model config's `_attn_implementation` (which attention a built model runs: transformers keeps no public
name for it). Called: the Trainer's `_save_rng_state` (each rank's last file of a checkpoint) and `_save_checkpoint`
(the whole save, wrapped to name a disk that filled), which ORTZeroTrainer extends, and `_get_output_dir` (where
that save goes). A model class's `_from_config` (what `AutoModelForCausalLM.from_config` calls: under ZeRO-3 it
builds the model in `zero.Init`), for a causal LM whose config the auto mapping does not list (MusicGen's decoder).
The JIT checkpoint callback's saved SIGTERM handler, given back when ort_zero's agreed stop replaces it.
"""

from __future__ import annotations

import signal
from typing import Any


def attention_implementation(model: Any) -> str | None:
    """The attention implementation a built transformers model runs ("sdpa", "eager", ...)."""
    return getattr(model.config, "_attn_implementation", None)


def save_rng_state(trainer_class: type, trainer: Any, output_dir: str) -> None:
    """What `trainer_class`'s bases do in `Trainer._save_rng_state` (each rank writes its RNG states)."""
    super(trainer_class, trainer)._save_rng_state(output_dir)


def save_checkpoint(trainer_class: type, trainer: Any, model: Any, trial: Any) -> None:
    """What `trainer_class`'s bases do in `Trainer._save_checkpoint` (the checkpoint of the current step)."""
    super(trainer_class, trainer)._save_checkpoint(model, trial)


def checkpoint_root(trainer: Any, trial: Any) -> str:
    """The folder the Trainer writes `checkpoint-N` into (`Trainer._get_output_dir`)."""
    return trainer._get_output_dir(trial=trial)


def model_from_config(model_class: Any, config: Any, **options: Any) -> Any:
    """`model_class` built from `config` as `AutoModelForCausalLM.from_config` builds the classes it maps."""
    return model_class._from_config(config, **options)


def remove_jit_checkpoint(trainer: Any) -> None:
    """Take transformers' JIT checkpoint callback (`enable_jit_checkpoint`) off `trainer` and give SIGTERM back to the
    handler it replaced (kept in its manager's `_original_sigterm_handler`)."""
    from transformers.trainer_jit_checkpoint import JITCheckpointCallback

    for callback in list(trainer.callback_handler.callbacks):
        if isinstance(callback, JITCheckpointCallback):
            manager = callback.jit_manager
            if manager is not None and manager._original_sigterm_handler is not None:
                signal.signal(signal.SIGTERM, manager._original_sigterm_handler)
            trainer.remove_callback(callback)
