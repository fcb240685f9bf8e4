"""ORT's symbolic shape inference (the pre-pass ORTModule runs on every exported graph), made to finish on the graphs
of the Mamba-2 mixers, where it gave up:

- it follows constants as possible shape values and converts each to an int: a constant that is not finite (the
  time-step clamp's upper limit, inf) raised OverflowError. A value that is not finite is no shape: it is unknown.
- on the sympy expressions of the mixers' chunked scan it recursed beyond Python's default limit (1000 frames);
  while it runs, the limit is raised (`SHAPE_INFERENCE_RECURSION_LIMIT`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

SHAPE_INFERENCE_RECURSION_LIMIT = 10_000


def finite_values_only(try_get_value: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps `SymbolicShapeInference._try_get_value`: a float constant with an infinite or NaN element is unknown."""

    @functools.wraps(try_get_value)
    def _try_get_value(self: Any, node: Any, index: int) -> Any:
        value = try_get_value(self, node, index)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all():
            return None
        return value

    return _try_get_value


def with_deeper_recursion(infer_shapes: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps `GraphTransitionManager._infer_shapes` (a staticmethod, called on the class): Python's recursion limit
    is at least `SHAPE_INFERENCE_RECURSION_LIMIT` while it runs."""

    @functools.wraps(infer_shapes)
    def _infer_shapes(model: Any) -> Any:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, SHAPE_INFERENCE_RECURSION_LIMIT))
        try:
            return infer_shapes(model)
        finally:
            sys.setrecursionlimit(limit)

    return _infer_shapes
