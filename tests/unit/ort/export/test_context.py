"""The export's stand-in buffer: zeros that cost no resident memory on CPU, even when every byte is read, and that
the shape-inference filter recognises through the exporter's detached aliases."""

from __future__ import annotations

import os

import torch

from ort_zero.hooks.export_mode import is_stand_in, standing_in
from ort_zero.ort.export import context as export_context

MIB = 2**20


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def test_reading_the_cpu_buffer_costs_no_memory() -> None:
    before = resident_mib()
    buffer = export_context.zeros_buffer(256 * MIB, torch.device("cpu"))
    weight = buffer.view(torch.float32).view(8192, 8192)  # 256 MiB of float32 zeros
    assert weight.sum().item() == 0  # reads every page, allocates nothing of its size
    assert resident_mib() - before < 16


def test_stand_ins_are_recognised_through_detached_aliases() -> None:
    buffer = export_context.zeros_buffer(MIB, torch.device("cpu"))
    view = buffer[: 1024 * 4].view(torch.float32).view(32, 32)
    with standing_in([buffer]):
        assert is_stand_in(view.detach())
        assert not is_stand_in(torch.zeros(32, 32))
    assert not is_stand_in(view), "still a stand-in once the export is over"


def test_shape_inference_is_handed_every_parameter_but_the_stand_ins() -> None:
    buffer = export_context.zeros_buffer(MIB, torch.device("cpu"))
    stand_in = buffer[:64].view(torch.float32).view(4, 4)
    real = torch.ones(4)
    handed: list[dict] = []
    infer = export_context.shape_inference_without_stand_ins(lambda graph, params, opset: handed.append(params))
    with standing_in([buffer]):
        infer(None, {"layer.weight": stand_in, "layer.bias": real}, 17)
    assert list(handed[0]) == ["layer.bias"]
