"""Other libraries' own ZeRO-3 gathers, run inside ORT's graph (registered in ort_zero.patches)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def gathering_parameters_only(gather: Callable[..., Any]) -> Callable[..., Any]:
    """TRL's `maybe_gather_lm_head_ctx` for the ZeRO-3 parameters among `params` only: in ORT the autograd Function
    that calls it gets the gathered tensors of ort_zero's bridges, which need no gather (and have no ZeRO-3 state)."""

    @functools.wraps(gather)
    def maybe_gather_lm_head_ctx(*params: Any) -> Any:
        return gather(*(param for param in params if hasattr(param, "ds_id")))

    return maybe_gather_lm_head_ctx
