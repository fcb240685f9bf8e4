"""train_gpt with its DeepSpeed engine compiled (`engine.compile()`: torch.compile with DeepSpeed's default backend
for the accelerator, inductor on CPU), for the run record's tests. Arguments are train_gpt's."""

from __future__ import annotations

import sys
from typing import Any

import deepspeed

from ort_zero.examples import train_gpt

_initialize = deepspeed.initialize


def initialize_compiled(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    engine, *rest = _initialize(*args, **kwargs)
    engine.compile()
    return (engine, *rest)


deepspeed.initialize = initialize_compiled

if __name__ == "__main__":
    sys.exit(train_gpt.main())
