"""transformers' internals that ort_zero reads (transformers `versions.TRANSFORMERS_VERSIONS`).

Read: a model config's `_attn_implementation` (which attention a built model runs: transformers keeps no public
name for it). Called: the Trainer's `_save_rng_state` (each rank's last file of a checkpoint), which ORTZeroTrainer
extends. Reformer's private autograd Function `_ReversibleFunction` (its forward's inputs: the export rewrite of its
backward).
"""

from __future__ import annotations

from typing import Any


def attention_implementation(model: Any) -> str | None:
    """The attention implementation a built transformers model runs ("sdpa", "eager", ...)."""
    return getattr(model.config, "_attn_implementation", None)


def save_rng_state(trainer_class: type, trainer: Any, output_dir: str) -> None:
    """What `trainer_class`'s bases do in `Trainer._save_rng_state` (each rank writes its RNG states)."""
    super(trainer_class, trainer)._save_rng_state(output_dir)


def reformer_reversible_forward() -> Any:
    """The forward of Reformer's `_ReversibleFunction` (the autograd Function its reversible layers run in)."""
    from transformers.models.reformer import modeling_reformer

    return modeling_reformer._ReversibleFunction.forward
