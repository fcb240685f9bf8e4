"""ORTModule's `InferenceManager`, which builds the graph a `torch.no_grad()` forward runs: ORT's graph-optimizer
registry never sees it, so the one training-graph pass an inference graph also needs runs here.

Each function takes the original ORT object and returns its replacement (the registry's factory protocol).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ...foreign import onnxruntime as ort_internals
from ..passes import half_precision_casts


def graph_built(original: Callable) -> Callable:
    """Wraps `InferenceManager._build_graph`: nodes the session's provider cannot run in bf16/fp16 compute in float32
    (`passes.half_precision_casts`), as in the training graph."""

    @functools.wraps(original)
    def _build_graph(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        model = ort_internals.optimized_model(self)
        half_precision_casts.widen_unsupported(
            model.graph, ort_internals.device(self).type, list(model.opset_import)
        ).log()
        return result

    return _build_graph
