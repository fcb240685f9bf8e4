"""The export's trace records torch's source ranges only where torch's ONNX passes compare them
(ort_zero/ort/export/source_ranges.py, stack/csrc/trace_sources.cpp): in-place indexing exports as before, every other
node records none, and torch's callback is back after the block, also after an error."""

from __future__ import annotations

import io

import pytest
import torch

from ort_zero.foreign import torch as torch_internals
from ort_zero.ort.export.source_ranges import compared_source_ranges_only
from ort_zero.stack import trace_sources

COMPARED = {"aten::slice", "aten::select", "aten::copy_", "aten::index_put_", "aten::fill_", "aten::add_"}
UNCOMPARED = {"aten::relu", "aten::mul", "aten::exp"}


class InPlaceIndexing(torch.nn.Module):
    """The indexing patterns torch's in-place passes group by source range (slice/select chains ending in-place)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = torch.relu(x) * 2
        z[1:3, 0] = y
        z[:, :2].copy_(x[:, 1:3])
        z[..., 3].fill_(1.0)
        z[2:, 1:] += 1
        z[:, 1:][torch.tensor([0, 3])] = torch.ones(2, 3)
        return z.exp()


def _traced_nodes() -> list[tuple[str, bool]]:
    """Each traced node's kind and whether it has a source range (constants left out)."""
    graph = torch.jit.trace(InPlaceIndexing(), (torch.randn(4, 4), torch.randn(2))).graph
    return [(node.kind(), bool(node.sourceRange())) for node in graph.nodes() if node.kind() != "prim::Constant"]


def _exported() -> bytes:
    exported = io.BytesIO()
    torch.onnx.export(InPlaceIndexing(), (torch.randn(4, 4), torch.randn(2)), exported, dynamo=False)
    return exported.getvalue()


def test_the_callback_is_built_and_torchs_is_readable() -> None:
    assert trace_sources.library() is not None, "run launch/bootstrap.sh (python -m ort_zero.stack.extensions ensure)"
    assert torch_internals.tracer_recorder() is not None


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.trace's deprecation
def test_inside_only_the_compared_nodes_record_a_source_range() -> None:
    with compared_source_ranges_only() as installed:
        nodes = _traced_nodes()
    assert installed
    assert {kind for kind, _ in nodes} >= COMPARED | UNCOMPARED
    assert [kind for kind, recorded in nodes if recorded != (kind in COMPARED)] == []


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_torchs_callback_is_back_after_the_block_and_after_an_error() -> None:
    torchs = torch_internals.tracer_recorder()
    with pytest.raises(RuntimeError, match="inside"):
        with compared_source_ranges_only():
            with compared_source_ranges_only() as nested:  # ort_zero's is installed: torch's is not wrapped twice
                assert not nested
            raise RuntimeError("inside")
    assert torch_internals.tracer_recorder() == torchs
    assert {kind for kind, recorded in _traced_nodes() if recorded} >= COMPARED | UNCOMPARED


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")  # the TorchScript exporter's
def test_in_place_indexing_exports_the_same_onnx_model() -> None:
    with compared_source_ranges_only():
        inside = _exported()
    assert inside == _exported()
