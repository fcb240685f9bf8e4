"""`ort-zero converge` for real: the README's main job (its defaults: 30 steps of the demo GPT on 2 CPU ranks, in
PyTorch and in ORT) must agree. About 40 s; a shorter run missed a divergence that appeared at step 11."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher import run_launcher

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "ort-zero"
STEPS = 30  # converge's default


def test_converge_agrees_and_writes_its_report_and_plot(tmp_path: Path) -> None:
    argv = [str(CONSOLE_SCRIPT), "converge", "--timeout", "300", "--output-dir", str(tmp_path)]
    result = run_launcher(argv, timeout=600, cwd=ROOT)  # fails with the output unless the exit code is 0
    assert "[converge] AGREE" in result.stdout
    report = (tmp_path / "report.md").read_text()
    assert "verdict: **agree**" in report
    rows = [line for line in report.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert [int(row.split("|")[1]) for row in rows] == list(range(STEPS))
    assert (tmp_path / "losses.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("pytorch", "ort"):
        assert (tmp_path / name / "losses.csv").is_file()
    training = json.loads((tmp_path / "ort" / "ort.json").read_text())["training"]
    assert training["session"] and "ort_zero.zero3.bridges.PreForwardBridge" in training["python_ops"], training
    assert "is accelerating your model" in (tmp_path / "ort" / "launcher.log").read_text()
    assert "is accelerating your model" not in (tmp_path / "pytorch" / "launcher.log").read_text()
