"""Exporting a ZeRO-3 model: partitioned parameters are stood in for by views of one shared buffer of zeros.

A trace must see full-sized weights (ops on (0)-sized ones fail, and ORT's shape inference needs the real shapes of
the parameter inputs) but must not run a collective (the exporter cannot trace ProcessGroup calls). So for the
duration of an export each partitioned parameter is a contiguous view of its `ds_shape` into one buffer of zeros
as large as the largest parameter, and is marked available, which keeps DeepSpeed from gathering it; the exported
graph is the same whatever the values, and no forward writes into its parameters.

The export must not need the whole model: the models people shard are the ones no rank can hold (measured before,
a 162M-parameter LLaMA raised every rank's RSS by its 650 MB while ORT traced it). Full-sized zeros per parameter
cost the model; zero-stride stand-ins cost nothing themselves, but every matmul copies such a weight to a dense one.
One buffer costs the largest parameter on an accelerator and nothing on CPU, where it is fresh anonymous memory:
reading it maps the kernel's zero page. torch's ONNX shape inference would copy every stand-in it is handed as a
constant (the model again): it infers their shapes from the graph's input types instead (`shape_inference_without_
stand_ins`).
"""

from __future__ import annotations

import contextlib
import functools
import mmap
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ...hooks import exporting
from ...hooks.export_mode import is_stand_in, standing_in


def zero3_named_params(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """ZeRO-3 parameters (persistent ones too) by their name in `module`: ORT gets all of them from bridges."""
    return {name: param for name, param in module.named_parameters() if hasattr(param, "ds_id")}


def is_zero3_module(module: torch.nn.Module) -> bool:
    return any(hasattr(param, "ds_id") for param in module.parameters())


def zeros_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """`nbytes` zero bytes; on CPU private anonymous memory, whose reads map the kernel's zero page: nothing is
    resident until written."""
    if device.type == "cpu":
        # Private: a shared anonymous mapping is shared memory, whose pages become resident when read.
        private = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return torch.frombuffer(private, dtype=torch.uint8)
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)


def shape_inference_without_stand_ins(infer_shapes: Callable[..., None]) -> Callable[..., None]:
    """torch's whole-graph ONNX shape inference, handed every parameter but the stand-ins: it would keep a dense copy
    of each as a constant value until it ends (measured: +255 MiB for 208 MiB of parameters). A trainable parameter
    is no constant of the graph; its shape is in its input's type."""

    @functools.wraps(infer_shapes)
    def infer_without_stand_ins(graph: Any, params_dict: dict[str, Any], opset_version: int) -> None:
        kept = {name: value for name, value in params_dict.items() if not is_stand_in(value)}
        return infer_shapes(graph, kept, opset_version)

    return infer_without_stand_ins


def _full_nbytes(param: torch.nn.Parameter) -> int:
    return param.ds_numel * param.element_size()


@contextlib.contextmanager
def stood_in_for_export(module: torch.nn.Module) -> Iterator[None]:
    """While it lasts, `module`'s partitioned parameters are full-shaped zeros (one buffer's views) marked available."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    params = [p for p in module.parameters() if getattr(p, "ds_status", None) == ZeroParamStatus.NOT_AVAILABLE]
    originals = [p.data for p in params]
    largest: dict[torch.device, int] = {}
    for param in params:
        largest[param.device] = max(largest.get(param.device, 0), _full_nbytes(param))
    buffers = {device: zeros_buffer(nbytes, device) for device, nbytes in largest.items()}
    for param in params:
        flat = buffers[param.device][: _full_nbytes(param)].view(param.dtype)
        param.data = flat.view(param.ds_shape)
        param.ds_status = ZeroParamStatus.AVAILABLE
    try:
        with standing_in(list(buffers.values())), exporting():
            yield
    finally:
        for param, data in zip(params, originals, strict=True):
            param.data = data
            param.ds_status = ZeroParamStatus.NOT_AVAILABLE
