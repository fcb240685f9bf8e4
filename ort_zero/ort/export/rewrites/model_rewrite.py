"""What a model rewrite declares: the patch group, the modeling file it applies to, the model types, why, and each
symbol it replaces with the factory of its replacement: one `Declaration` per symbol, sharing the reason and the
model types (registered by `ort_zero.patches`, the one registry)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ....declaration import Declaration


@dataclass(frozen=True)
class Replacement:
    name: str  # the patch's name in ort_zero.patches
    target: str  # the symbol: "module.attribute" or "module:Class.attribute" (transformers' or torch's)
    factory: Callable[[Any], Any]  # the patch's factory: the replaced symbol -> what runs instead while exported


@dataclass(frozen=True)
class ModelRewrite:
    group: str  # the patch group in ort_zero.patches
    modeling_module: str  # the transformers module whose classes the model is built from
    model_types: tuple[str, ...]
    reason: str
    replacements: tuple[Replacement, ...]

    def declarations(self) -> list[Declaration]:
        return [
            Declaration(part.name, part.target, self.reason, part.factory, self.model_types)
            for part in self.replacements
        ]


def instead(replacement: Callable[..., Any]) -> Callable[[Any], Any]:
    """The factory of a replacement that does not wrap what it replaces: `replacement` itself, whatever that is."""
    return lambda replaced: replacement
