"""transformers' internals that ort_zero reads (transformers `versions.TRANSFORMERS_VERSIONS`).

Read: a model config's `_attn_implementation` (which attention a built model runs: transformers keeps no public
name for it).
"""

from __future__ import annotations

from typing import Any


def attention_implementation(model: Any) -> str | None:
    """The attention implementation a built transformers model runs ("sdpa", "eager", ...)."""
    return getattr(model.config, "_attn_implementation", None)
