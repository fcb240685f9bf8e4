"""torch's internals ort_zero writes (ort_zero/foreign/torch.py): the tracer's source-location callback."""

from __future__ import annotations

import torch

from ort_zero.foreign import torch as torch_internals


def _traced_source_ranges() -> list[str]:
    def doubled_plus_one(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    graph, _ = torch.jit._get_trace_graph(doubled_plus_one, (torch.ones(3),))
    return [node.sourceRange() for node in graph.nodes() if node.kind().startswith("aten::")]


def test_the_trace_records_no_python_stack_inside_and_torchs_own_again_after() -> None:
    before = _traced_source_ranges()
    with torch_internals.tracer_without_source_locations():
        inside = _traced_source_ranges()
    after = _traced_source_ranges()

    assert before and all(__file__ in source for source in before)  # torch's callback: the Python stack
    assert len(inside) == len(before) and not any(inside)
    assert len(after) == len(before) and all(__file__ in source for source in after)


def test_a_failing_block_still_gets_torchs_callback_back() -> None:
    try:
        with torch_internals.tracer_without_source_locations():
            raise KeyError("inside")
    except KeyError:
        pass
    assert all(__file__ in source for source in _traced_source_ranges())
