"""accelerate's objects that ort_zero writes into (accelerate as pinned in setup.py).

Written: an `Accelerator`'s `prepare`, on the instance a Trainer made (so the DeepSpeed engine wraps the ORTModule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def prepare_through(accelerator: Any, transform: Callable[[Any], Any]) -> None:
    """From now on `accelerator.prepare(*objects)` prepares `transform(o)` for each object instead."""
    prepare = accelerator.prepare

    def prepare_transformed(*objects: Any, **kwargs: Any) -> Any:
        return prepare(*(transform(o) for o in objects), **kwargs)

    accelerator.prepare = prepare_transformed
