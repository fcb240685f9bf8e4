"""Once ORT's training session exists, ORTModule's graph builder is released (`ort.integration.graph_builder_released`):
ORTModule makes a new one before every build of the graphs (`_initialize_graph_builder` precedes each `_build_graph`),
and the session it built keeps training.
"""

from __future__ import annotations

import copy

import pytest
import torch

ortmodule = pytest.importorskip("onnxruntime.training.ortmodule")

import ort_zero  # noqa: E402


def test_the_graph_builder_goes_once_the_session_exists_and_training_goes_on() -> None:
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ort_zero.enable_zero3()
    try:
        model = ortmodule.ORTModule(copy.deepcopy(plain))
        manager = model._torch_module._execution_manager(True)
        for step in range(3):
            x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step))
            model(x).sum().backward()
            plain(x).sum().backward()
            assert manager._execution_agent is not None, "no ORT session ran"
            assert manager._graph_builder is None
        for ort_param, param in zip(model.parameters(), plain.parameters(), strict=True):
            assert torch.allclose(ort_param.grad, param.grad, atol=1e-5)
    finally:
        ort_zero.disable_zero3()
