"""ZeRO-3 parameter lifecycles through ort_zero's hooks against native DeepSpeed ZeRO-3 (2 CPU ranks, torchrun).

What DeepSpeed's own tests (test_zero_context_return.py, test_zero_activation_checkpoint_lifecycle.py) check: a
module that returns its own parameter hands it to the enclosing module as an external parameter, gathered; modules
inside a non-reentrant checkpoint release their parameters (and those gathered for the recompute) after their
backward; an exception in a recompute forward or in the backward leaves nothing gathered for the retry. The state is
recorded at the same boundaries in both runs (scripts/run_zero3_lifecycle.py) and must be identical.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd
from parity import BRIDGES, assert_same_params

SCRIPT = Path(__file__).parent / "scripts" / "run_zero3_lifecycle.py"
SCENARIOS = ["returned_param", "checkpoint_steps", "recompute_exception", "incomplete_backward"]


def run(out: Path, mode: str, scenarios: list[str]) -> list[dict]:
    """Every rank's {scenario: record} from one 2-rank launch."""
    args = ["--mode", mode, "--out", str(out), *(a for s in scenarios for a in ("--scenario", s))]
    run_launcher(torchrun_cmd(SCRIPT, args, port=free_port()), timeout=240, cwd=SCRIPT.parent)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def pairs(reference: list[dict], result: list[dict], scenario: str) -> list[tuple[int, tuple[dict, dict]]]:
    """(rank, (reference record, record)) of `scenario`; a scenario that raised fails here with its error."""
    for run_records in (reference, result):
        for rank, records in enumerate(run_records):
            assert "error" not in records[scenario], f"rank {rank}, {scenario}: {records[scenario]['error']}"
    return list(enumerate(zip((r[scenario] for r in reference), (r[scenario] for r in result), strict=True)))


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run(tmp_path_factory.mktemp("native"), "native", SCENARIOS)


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    ranks = run(tmp_path_factory.mktemp("torch"), "torch", SCENARIOS)
    assert all(rank[s]["ort_zero_hooks"] for rank in ranks for s in SCENARIOS), "ort_zero's hooks were not installed"
    return ranks


def test_returned_parameter_becomes_an_external_parameter_of_the_enclosing_module(native, patched) -> None:
    for rank, (expected, got) in pairs(native, patched, "returned_param"):
        # what native does (else the comparison proves nothing): the module that got the bias sees the parameter
        # behind it, gathered; the module using the bias after that one returned it owns it as external
        assert expected["seen"] == [{"param": True, "status": "AVAILABLE"}] * 3
        assert expected["states"][-1]["external"] == {"<root>": ["passes.inner.bias"]}
        assert got["seen"] == expected["seen"], f"rank {rank}"
        assert got["states"] == expected["states"], f"rank {rank}"
        assert got["losses"] == expected["losses"], f"rank {rank}"
        assert_same_params(expected["params"], got["params"], rtol=0.0, atol=0.0)


def test_checkpointed_modules_release_after_their_backward(native, patched) -> None:
    """Three clean steps; state once the checkpointed region's backward ran (before DeepSpeed's end-of-backward
    cleanup) and after each step: nothing gathered, no recompute parameters."""
    for rank, (expected, got) in pairs(native, patched, "checkpoint_steps"):
        assert len(expected["after_region"]) == 3
        assert all(not s["gathered"] and not s["recompute"] for s in expected["after_region"])
        assert got["after_region"] == expected["after_region"], f"rank {rank}"
        assert got["after_step"] == expected["after_step"], f"rank {rank}"


@pytest.mark.parametrize(
    ("scenario", "failure"),
    [("recompute_exception", "injected: recompute forward"), ("incomplete_backward", "injected: backward")],
)
def test_failed_backward_leaves_nothing_for_the_retry(native, patched, scenario: str, failure: str) -> None:
    """engine.backward fails once; at the retry's start (after DeepSpeed's step start) and after the retry's
    own loss.backward() (which skips DeepSpeed's end-of-backward cleanup) the state is native's: clean."""
    for rank, (expected, got) in pairs(native, patched, scenario):
        assert failure in expected["failure"] and failure in (got["failure"] or ""), f"rank {rank}"
        assert not expected["after_retry"]["gathered"] and not expected["after_retry"]["recompute"]
        assert got["at_retry_start"] == expected["at_retry_start"], f"rank {rank}"
        assert got["after_retry"] == expected["after_retry"], f"rank {rank}"


def test_ort_module_returning_its_parameter_matches_native(tmp_path: Path, native) -> None:
    """In ORT (fallback disabled, session and bridge PythonOps checked) the returned bias becomes the outer module's
    external parameter as natively, and training stays on native's curve."""
    ranks = run(tmp_path, "ort", ["returned_param"])
    for rank, (expected, got) in pairs(native, ranks, "returned_param"):
        assert got["ort"]["session"] and BRIDGES <= set(got["ort"]["python_ops"]), f"rank {rank}: not run in ORT"
        for key in ("external", "is_external"):
            assert got["states"][-1][key] == expected["states"][-1][key], f"rank {rank}: {key}"
        assert got["losses"] == pytest.approx(expected["losses"], rel=1e-5, abs=1e-6)
        assert_same_params(expected["params"], got["params"], rtol=1e-5, atol=1e-6)
