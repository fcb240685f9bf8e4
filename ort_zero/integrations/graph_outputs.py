"""Module outputs of an ORT run for its run record: ORT runs its graph, not the modules' forwards, so the export
leaves a recorder op on every module output (`hooks.statistics`), and ORT runs back into it at every step.

The ops are identities, and every rank gets them, so that the ranks run one graph; they cut the graph where ORT might
fuse across two modules, so a recorded ORT run may round differently from an unrecorded one (not beyond fp32's
tolerance in the tests).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..foreign import onnxruntime as ort_internals
from ..hooks import SubscriberManager
from ..hooks.statistics import ACTIVATION, StatisticsSubscriber

NOT_RECORDED = (
    "ort_zero: this run record has no module outputs: the ORT model was exported before recording began "
    "(record before the first step to have them)"
)


class GraphOutputs(StatisticsSubscriber):
    """A statistics subscriber that hands each module output to the run record instead of writing a dump."""

    def __init__(self, keep: Callable[[str, torch.Tensor], None]) -> None:
        super().__init__(Path())
        self.keep = keep

    def record(self, name: str, tensor: torch.Tensor, kind: str = ACTIVATION) -> None:
        self.keep(name, tensor)


def record_outputs(ort_module: torch.nn.Module, keep: Callable[[str, torch.Tensor], None]) -> bool:
    """Have `keep(name, output)` called with every module output of `ort_module`'s model at every step; False, and
    nothing subscribed, when its graph has already been exported."""
    if ort_internals.has_exported(ort_module):
        return False
    SubscriberManager().subscribe(ort_module.module, [GraphOutputs(keep)])
    return True
