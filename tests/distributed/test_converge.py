"""`ort-zero converge` for real: the README's main job (its defaults: 30 steps of the demo GPT on 2 CPU ranks, in
PyTorch and in ORT) must agree. About 40 s; a shorter run missed a divergence that appeared at step 11. With the
memory optimizer on (a smaller GPT), the curves must agree too and the report must name what was recomputed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from launcher import run_launcher

from ort_zero.tools.recompute_summary import describe_recompute, recompute_applied

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "ort-zero"
STEPS = 30  # converge's default


def test_converge_agrees_and_writes_its_report_and_plot(tmp_path: Path) -> None:
    argv = [str(CONSOLE_SCRIPT), "converge", "--timeout", "300", "--output-dir", str(tmp_path)]
    result = run_launcher(argv, timeout=600, cwd=ROOT)  # fails with the output unless the exit code is 0
    assert "[converge] AGREE" in result.stdout
    report = (tmp_path / "report.md").read_text()
    assert "verdict: **agree**" in report
    assert f"- records: AGREE over {STEPS} steps" in report  # the runs' records, step by step, as compare reads them
    assert "verdict: AGREE" in (tmp_path / "records.md").read_text()  # compare's report of them, and its plot
    assert (tmp_path / "records.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line for line in report.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert [int(row.split("|")[1]) for row in rows] == list(range(STEPS))
    assert (tmp_path / "losses.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("pytorch", "ort"):
        assert (tmp_path / name / "losses.csv").is_file()
    training = json.loads((tmp_path / "ort" / "ort.json").read_text())["training"]
    assert training["session"] and "ort_zero.zero3.bridges.PreForwardBridge" in training["python_ops"], training
    assert not (tmp_path / "pytorch" / "ort.json").exists(), "the PyTorch side wrote an ORT record"


N_LAYER = 2


@pytest.mark.extended
def test_converge_with_the_memory_optimizer_agrees_and_reports_its_recompute(tmp_path: Path) -> None:
    """`--memory-opt-level 1` on a small GPT: recomputing each layer must not change the curve, and the report must
    say what the ORT run's ort.json says it recomputed (every layer)."""
    argv = [
        str(CONSOLE_SCRIPT), "converge", "--memory-opt-level", "1", "--steps", "6", "--timeout", "300",
        "--output-dir", str(tmp_path), "--", "--n-layer", str(N_LAYER), "--d-model", "64", "--seq-len", "32",
    ]  # fmt: skip
    result = run_launcher(argv, timeout=600, cwd=ROOT)
    assert "[converge] AGREE" in result.stdout
    assert json.loads((tmp_path / "ort" / "args.json").read_text())["memory_opt_level"] == 1  # the ORT run saw it
    record = json.loads((tmp_path / "ort" / "ort.json").read_text())["training"].get("recompute")
    line = f"ORT run at ORTMODULE_MEMORY_OPT_LEVEL=1, recompute: {describe_recompute(record)}"
    assert recompute_applied(record) and record["level"] == 1, record
    assert len(record["layers"]) == N_LAYER and all("blocks." in layer for layer in record["layers"]), record
    assert f"- {line}\n" in (tmp_path / "report.md").read_text()
    assert f"[converge] {line}\n" in result.stdout


@pytest.mark.extended
def test_converge_in_bf16_agrees_within_bf16s_own_spread(tmp_path: Path) -> None:
    """The README's main job in bf16: its curves part at step 10-11 (one step's loss 1.2 off, then back), and PyTorch
    parts from itself there too when it sums in another order; the report says so and the job agrees."""
    argv = [str(CONSOLE_SCRIPT), "converge", "--precision", "bf16", "--timeout", "300", "--output-dir", str(tmp_path)]
    result = run_launcher(argv, timeout=900, cwd=ROOT)
    assert "[converge] AGREE" in result.stdout
    report = (tmp_path / "report.md").read_text()
    assert "verdict: **agree**" in report and "bf16's own spread" in report, report
    for name in ("pytorch", "ort", "pytorch_reordered"):
        assert (tmp_path / name / "losses.csv").is_file()
    assert json.loads((tmp_path / "ort" / "ort.json").read_text())["training"]["session"]
