"""A ZeRO-3 model's export runs its forward once, the trace (ort_zero/ort/ortmodule/graph_transition_manager.py):
ORT's outputs' structure, names and dynamic axes come from that forward; a model without ZeRO-3 parameters is
exported by ORT's own code (a forward for the structure, then the trace)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.foreign import onnxruntime as ort_internals
from ort_zero.ort.inspection import ort_run_record
from ort_zero.ort.ortmodule import graph_transition_manager

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

FORWARDS: list[tuple[int, ...]] = []  # the input shapes of every forward (a module-level list: deep copies share it)


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        FORWARDS.append(tuple(x.shape))
        hidden = self.linear(x)
        return {"logits": hidden, "pooled": hidden.mean(0)}


@pytest.fixture
def enabled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    FORWARDS.clear()
    ort_zero.enable_zero3()
    yield
    ort_zero.disable_zero3()


@pytest.fixture
def as_zero3(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model is exported as a ZeRO-3 model is (without DeepSpeed, its parameters are whole: no stand-ins)."""
    monkeypatch.setattr(graph_transition_manager, "is_zero3_module", lambda module: True)


def _trained(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    outputs = model(x)
    (outputs["logits"].sum() + outputs["pooled"].sum()).backward()
    return outputs


def test_a_zero3_export_runs_the_forward_once(enabled: None, as_zero3: None) -> None:
    torch.manual_seed(0)
    reference, model = TwoOutputs(), TwoOutputs()
    model.load_state_dict(reference.state_dict())
    in_ort = ortmodule.ORTModule(model)
    x = torch.randn(5, 4)

    got = _trained(in_ort, x)
    assert FORWARDS == [(5, 4)], "the export ran the model's forward more than once"
    expected = _trained(reference, x)
    assert ort_run_record(in_ort)["training"]["session"], "not run in ORT"
    assert got.keys() == expected.keys()  # the outputs' structure, from the trace's forward
    for name in expected:
        torch.testing.assert_close(got[name], expected[name])
    torch.testing.assert_close(model.linear.weight.grad, reference.linear.weight.grad)


def test_the_outputs_are_named_with_dynamic_axes(enabled: None, as_zero3: None) -> None:
    in_ort = ortmodule.ORTModule(TwoOutputs())
    _trained(in_ort, torch.randn(5, 4))
    manager = ort_internals.execution_manager(in_ort, training=True)
    exported = manager._graph_transition_manager._exported_model_info.exported_model
    outputs = {
        output.name: [dim.dim_param for dim in output.type.tensor_type.shape.dim] for output in exported.graph.output
    }
    assert outputs == {"output-0": ["output-0_dim0", "output-0_dim1"], "output-1": ["output-1_dim0"]}
    got = _trained(in_ort, torch.randn(7, 4))  # another batch size, the same graph
    assert got["logits"].shape == (7, 3) and len(FORWARDS) == 1


def test_the_export_cache_is_not_used_and_said_once(
    enabled: None, as_zero3: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ORTMODULE_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=graph_transition_manager.__name__):
        for _ in range(2):
            model = ortmodule.ORTModule(TwoOutputs())
            _trained(model, torch.randn(5, 4))
            assert ort_run_record(model)["training"]["session"], "not run in ORT"
    notices = [record for record in caplog.records if "ORTMODULE_CACHE_DIR" in record.getMessage()]
    assert len(notices) == 1 and not list(tmp_path.iterdir())
    assert len(FORWARDS) == 2


def test_a_model_without_zero3_parameters_is_exported_by_ort(enabled: None) -> None:
    in_ort = ortmodule.ORTModule(TwoOutputs())
    _trained(in_ort, torch.randn(5, 4))
    assert FORWARDS == [(5, 4), (5, 4)]  # ORT's forward for the outputs' structure, then its trace


class InPlaceSlice(nn.Module):
    """Notes, while torch traces it, which of the trace's nodes have a source range."""

    def __init__(self, traced: list[tuple[str, bool]]) -> None:
        super().__init__()
        self.linear, self.traced = nn.Linear(4, 3), traced

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(x) * 1.5
        hidden[:, :1] = hidden[:, 1:2] * 2  # a slice chain ending in copy_: torch's in-place pass compares them
        tracing = torch._C._get_tracing_state()
        if tracing is not None:
            self.traced.extend(_kinds_and_ranges(tracing.graph().nodes()))
        return hidden.square().mean()


def _kinds_and_ranges(nodes: Any) -> Iterator[tuple[str, bool]]:
    """Each node's kind and whether it has a source range, inside the blocks of module calls too."""
    for node in nodes:
        yield node.kind(), bool(node.sourceRange())
        for block in node.blocks():
            yield from _kinds_and_ranges(block.nodes())


def test_a_zero3_export_records_source_ranges_only_for_the_nodes_torchs_passes_compare(
    enabled: None, as_zero3: None
) -> None:
    traced: list[tuple[str, bool]] = []
    torch.manual_seed(0)
    reference, model = InPlaceSlice([]), InPlaceSlice(traced)
    model.load_state_dict(reference.state_dict())
    in_ort, x = ortmodule.ORTModule(model), torch.randn(5, 4)
    in_ort(x).backward()
    reference(x).backward()
    assert ort_run_record(in_ort)["training"]["session"], "not run in ORT"
    recorded = {kind for kind, has_range in traced if has_range}
    assert recorded == {"aten::slice", "aten::copy_"}, traced  # not aten::linear, mul, pow, mean
    torch.testing.assert_close(model.linear.weight.grad, reference.linear.weight.grad)
