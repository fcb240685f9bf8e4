"""The pass pipeline: every pass file is in it once, in an order that meets each pass's needs, a pass whose needs are
not met stops the pipeline before it touches the graph, and a pass edits the graph only as it declares (`contract`)."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.ort.passes import pipeline  # noqa: E402
from ort_zero.ort.passes.base import GraphPass, TrainingGraph  # noqa: E402
from ort_zero.ort.passes.contract import Edit  # noqa: E402

PASSES_DIR = Path(pipeline.__file__).parent


def test_every_pass_file_runs_once_in_one_pipeline() -> None:
    """A module that defines a PASS is a pass, named after its file; helpers (training_graph, recompute_region) not."""
    defined = {}
    for path in sorted(PASSES_DIR.glob("*.py")):
        module = importlib.import_module(f"ort_zero.ort.passes.{path.stem}")
        if hasattr(module, "PASS"):
            defined[path.stem] = module.PASS
    assert all(graph_pass.name == stem for stem, graph_pass in defined.items())
    in_pipelines = [*pipeline.EXPORT_PASSES, *pipeline.TRAINING_GRAPH_PASSES]
    assert sorted(p.name for p in in_pipelines) == sorted(defined)


@pytest.mark.parametrize("passes", [pipeline.EXPORT_PASSES, pipeline.TRAINING_GRAPH_PASSES], ids=["export", "training"])
def test_the_pipelines_meet_every_need(passes: tuple[GraphPass, ...]) -> None:
    assert pipeline.unmet_needs(passes) == []
    if any(graph_pass.needs for graph_pass in passes):
        assert pipeline.unmet_needs(tuple(reversed(passes))) != [], "reversed, some pass must miss what it needs"


@dataclass
class Ran:
    def log(self) -> None:
        pass


def test_a_pass_whose_needs_are_unmet_stops_the_run() -> None:
    ran: list[str] = []
    first = GraphPass("first", lambda graph: ran.append("first") or Ran(), frozenset(), provides=frozenset({"a"}))
    second = GraphPass("second", lambda graph: ran.append("second") or Ran(), frozenset(), needs=frozenset({"b"}))
    graph = TrainingGraph(onnx.GraphProto(), recompute_level=0)

    with pytest.raises(RuntimeError, match="second needs \\['b'\\]"):
        pipeline._run((first, second), graph)

    assert ran == ["first"] and graph.provided == {"a"}


def _graph() -> onnx.GraphProto:
    nodes = [
        onnx.helper.make_node("Identity", ["x"], ["a"], "first"),
        onnx.helper.make_node("Relu", ["a"], ["b"], "second"),
    ]
    return onnx.helper.make_graph(nodes, "g", [], [])


def _removing_the_first(graph: TrainingGraph) -> Ran:
    graph.graph.node[1].input[0] = "x"
    del graph.graph.node[0]
    return Ran()


@pytest.mark.parametrize("declared", [frozenset({Edit.REWIRE}), frozenset({Edit.REMOVE})])
def test_an_edit_a_pass_does_not_declare_stops_it(declared: frozenset, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORT_ZERO_CHECK_PASSES", "1")
    undeclared = Edit.REMOVE if Edit.REWIRE in declared else Edit.REWIRE
    graph = TrainingGraph(_graph(), recompute_level=0)
    with pytest.raises(RuntimeError, match=f"graph pass removing {re.escape(undeclared.value)} \\((first|second)\\)"):
        pipeline._run((GraphPass("removing", _removing_the_first, declared),), graph)


def test_a_pass_that_declares_its_edits_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORT_ZERO_CHECK_PASSES", "1")
    graph = TrainingGraph(_graph(), recompute_level=0)
    pipeline._run((GraphPass("removing", _removing_the_first, frozenset({Edit.REWIRE, Edit.REMOVE})),), graph)
    assert [node.name for node in graph.graph.node] == ["second"]


def test_every_pass_declares_what_it_does_and_the_tests_check_it() -> None:
    """Each pass states its edits; the test run checks them in every pipeline it runs (tests/conftest.py)."""
    import os

    assert os.environ.get("ORT_ZERO_CHECK_PASSES") == "1"
    for graph_pass in (*pipeline.EXPORT_PASSES, *pipeline.TRAINING_GRAPH_PASSES):
        assert graph_pass.edits and graph_pass.edits <= set(Edit), graph_pass.name
