"""Exporting a ZeRO-3 model: partitioned parameters are stood in for by local, full-sized zeros.

A trace must see full-sized weights (ops on (0)-sized ones fail, and ORT's shape inference needs the real shapes of
the parameter inputs) but must not run a collective (the exporter cannot trace ProcessGroup calls). So for the
duration of an export each partitioned parameter holds zeros of its `ds_shape` and is marked available, which keeps
DeepSpeed from gathering it; the exported graph is the same whatever the values. Cost: the full model's size in
memory, once per export.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..hooks import exporting


def zero3_named_params(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """ZeRO-3 parameters (persistent ones too) by their name in `module`: ORT gets all of them from bridges."""
    return {name: param for name, param in module.named_parameters() if hasattr(param, "ds_id")}


def is_zero3_module(module: torch.nn.Module) -> bool:
    return any(hasattr(param, "ds_id") for param in module.parameters())


@contextlib.contextmanager
def materialized_for_export(module: torch.nn.Module) -> Iterator[None]:
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    stand_ins = [p for p in module.parameters() if getattr(p, "ds_status", None) == ZeroParamStatus.NOT_AVAILABLE]
    originals = [p.data for p in stand_ins]
    for param in stand_ins:
        param.data = torch.zeros(param.ds_shape, dtype=param.dtype, device=param.device)
        param.ds_status = ZeroParamStatus.AVAILABLE
    try:
        with exporting():
            yield
    finally:
        for param, data in zip(stand_ins, originals, strict=True):
            param.data = data
            param.ds_status = ZeroParamStatus.NOT_AVAILABLE
