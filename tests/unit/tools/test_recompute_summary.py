"""The one-line description of a run's `training.recompute` record that converge and the benchmark print."""

from __future__ import annotations

from typing import Any

import pytest

from ort_zero.tools.recompute_summary import describe_recompute, recompute_applied


def record(level: int, plans: dict[str, int], layers: int = 2, nodes: int = 40) -> dict[str, Any]:
    return {"level": level, "layers": [f"blocks.{i}" for i in range(layers)], "plans": plans, "recomputed_nodes": nodes}


def test_applied_plans_are_named_with_their_counts_and_layers() -> None:
    line = describe_recompute(record(1, {"layer": 2, "unused": 0, "attention": 1}))
    assert line == "level 1: attention x1, layer x2 over 2 modules (blocks.0, blocks.1); 40 nodes recomputed"


def test_many_layers_show_the_first_and_the_last() -> None:
    line = describe_recompute(record(2, {"layer": 16}, layers=16))
    assert "16 modules (blocks.0 ... blocks.15)" in line and "blocks.7" not in line


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (None, "none applied: the run record has no recompute entry"),
        (record(0, {}, layers=0, nodes=0), "none applied (no region of the training graph is recomputed)"),
        (record(0, {"layer": 0}, layers=0, nodes=0), "none applied (no region"),
    ],
)
def test_nothing_recomputed_is_said_plainly(entry: dict[str, Any] | None, expected: str) -> None:
    assert not recompute_applied(entry)
    assert describe_recompute(entry).startswith(expected)


def test_applied_needs_a_plan_applied_at_least_once() -> None:
    assert recompute_applied(record(1, {"layer": 0, "other": 1}))
