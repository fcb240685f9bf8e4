"""`ort-zero converge` without a launcher: verdicts and exit codes on synthetic curves, config preflight, timeouts."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ort_zero.cli import converge, main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REFERENCE = [5.5, 4.25, 3.125, 2.5]


def parse(tmp_path: Path, *extra: str) -> argparse.Namespace:
    """The arguments `ort-zero converge` would get, with the output under `tmp_path`."""
    parser = main.build_parser("converge")
    return parser.parse_args(["converge", "--steps", str(len(REFERENCE)), "--output-dir", str(tmp_path), *extra])


def fake_train(
    monkeypatch: pytest.MonkeyPatch,
    curves: dict[str, list[float] | None],
    ort_training: dict[str, Any] | None = None,
) -> list[tuple[str, Path]]:
    """Replace the launcher: `_train` writes `curves[run name]`, else `curves[flag]`, as losses.csv (None: the run
    fails) and, for the ORT run, `ort_training` as its ort.json's "training" (None: no ort.json); the calls."""
    calls: list[tuple[str, Path]] = []

    def train(args: argparse.Namespace, flag: str, run_dir: Path, threads: int | None = None) -> str | None:
        calls.append((flag, run_dir))
        values = curves[run_dir.name if run_dir.name in curves else flag]
        if values is None:
            return "exit code 1 (see launcher.log)"
        run_dir.mkdir(parents=True, exist_ok=True)
        with (run_dir / "losses.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["step", "loss", "time_ms"])
            writer.writerows([step, repr(loss), f"{10.0 + step:.3f}"] for step, loss in enumerate(values))
        if flag == "--ort" and ort_training is not None:
            (run_dir / "ort.json").write_text(json.dumps({"training": ort_training, "inference": {}}))
        return None

    monkeypatch.setattr(converge, "_train", train)
    return calls


def table_rows(report: str) -> list[list[str]]:
    """The per-step rows of report.md's table, as cells."""
    lines = [line for line in report.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_agreeing_curves_exit_0_with_a_table_a_verdict_and_a_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ort = [loss * (1 + 1e-6) for loss in REFERENCE]
    calls = fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": ort})
    assert converge.run(parse(tmp_path)) == 0
    assert calls == [("--no-ort", tmp_path / "pytorch"), ("--ort", tmp_path / "ort")]
    report = (tmp_path / "report.md").read_text()
    assert "verdict: **agree**" in report and "first step beyond tolerance: -" in report
    assert "`--no-ort`" in report and "ORTModule" in report  # says what "PyTorch" means
    rows = table_rows(report)
    assert [int(row[0]) for row in rows] == list(range(len(REFERENCE)))
    for row, a, b in zip(rows, REFERENCE, ort, strict=True):
        assert float(row[1]) == pytest.approx(a, abs=1e-6) and float(row[2]) == pytest.approx(b, abs=1e-6)
        assert float(row[3]) == pytest.approx(abs(a - b), rel=1e-2)
    assert (tmp_path / "losses.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "AGREE" in capsys.readouterr().out


def test_diverging_curves_exit_1_and_name_the_first_diverging_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ort = [REFERENCE[0], REFERENCE[1] * (1 + 1e-5), REFERENCE[2] * 1.01, REFERENCE[3] * 1.1]
    fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": ort})
    assert converge.run(parse(tmp_path, "--rtol", "1e-4")) == 1
    report = (tmp_path / "report.md").read_text()
    assert "verdict: **diverge**" in report and "first step beyond tolerance: 2\n" in report
    assert converge.DIVERGENCE_HINT in report  # where to look: Adam's eps, then activation statistics
    assert "first beyond tolerance at step 2" in capsys.readouterr().out
    assert (tmp_path / "losses.png").read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("failing", ["--no-ort", "--ort"])
def test_a_failing_run_exits_2_without_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], failing: str
) -> None:
    calls = fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": REFERENCE, failing: None})
    assert converge.run(parse(tmp_path)) == 2
    assert calls[-1][0] == failing
    assert "run failed: exit code 1" in capsys.readouterr().err
    assert not (tmp_path / "report.md").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"train_micro_batch_size_per_gpu": 4,', "is not valid JSON"),
        ('{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}', "needs ZeRO stage 3"),
        ('{"train_batch_size": 3, "zero_optimization": {"stage": 3}}', "not divisible by the world size 2"),
        (None, "DeepSpeed config not found"),
    ],
)
def test_an_unusable_config_exits_2_before_any_launch(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    message: str,
) -> None:
    config = tmp_path / "ds.json"
    if content is not None:
        config.write_text(content)
    calls = fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": REFERENCE})
    assert converge.run(parse(tmp_path / "out", "--deepspeed_config", str(config), "--nproc", "2")) == 2
    err = capsys.readouterr().err
    assert message in err and str(config) in err
    assert calls == []


def test_the_default_config_passes_the_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": REFERENCE})
    assert converge.run(parse(tmp_path)) == 0


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# A launcher that, like torchrun, starts its worker in a session of its own; killing its group misses the worker.
LAUNCHER = """
import json, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(json.dumps(child.pid))
time.sleep(600)
"""


def test_a_timeout_stops_the_launcher_and_workers_in_other_sessions(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.json"
    began = time.monotonic()
    with (tmp_path / "launcher.log").open("w") as log:
        result = converge.launch([sys.executable, "-c", LAUNCHER, str(pid_file)], dict(os.environ), log, timeout=5)
    assert result is None
    assert time.monotonic() - began < 5 + converge.STOP_GRACE_S
    worker = json.loads(pid_file.read_text())
    assert wait_for(lambda: not alive(worker), 2), f"worker {worker} in its own session survived the timeout"


def test_a_finished_launch_returns_its_exit_code(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "print('hi'); raise SystemExit(3)"]
    with (tmp_path / "launcher.log").open("w") as log:
        assert converge.launch(command, dict(os.environ), log, timeout=60) == 3
    assert (tmp_path / "launcher.log").read_text() == "hi\n"


MEMORY_OPT = "ORTMODULE_MEMORY_OPT_LEVEL"
SESSION = {"session": True, "python_ops": ["ort_zero.zero3.bridges.PreForwardBridge"]}
RECOMPUTED = {"level": 1, "layers": ["blocks.0", "blocks.1"], "plans": {"layer": 2}, "recomputed_nodes": 40}


def recompute_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if f"ORT run at {MEMORY_OPT}=" in line]


def test_the_memory_opt_level_reaches_the_ort_run_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_OPT, "2")  # the flag wins over the caller's variable
    args = parse(tmp_path, "--memory-opt-level", "1")
    fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": REFERENCE}, {**SESSION, "recompute": RECOMPUTED})
    assert converge.run(args) == 0
    assert converge.run_environment(args, "--ort")[MEMORY_OPT] == "1"
    assert MEMORY_OPT not in converge.run_environment(args, "--no-ort")


def test_without_the_flag_the_variable_passes_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_OPT, "2")
    args = parse(tmp_path)
    fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": REFERENCE}, SESSION)
    assert converge.run(args) == 0
    assert converge.run_environment(args, "--ort")[MEMORY_OPT] == "2"
    assert recompute_lines((tmp_path / "report.md").read_text())[0].startswith(f"- WARNING: ORT run at {MEMORY_OPT}=2")


def test_the_report_names_the_recompute_plans_the_ort_run_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": REFERENCE}, {**SESSION, "recompute": RECOMPUTED})
    assert converge.run(parse(tmp_path, "--memory-opt-level", "1")) == 0
    expected = (
        f"ORT run at {MEMORY_OPT}=1, recompute: level 1: layer x2 over 2 modules (blocks.0, blocks.1); "
        "40 nodes recomputed"
    )
    assert recompute_lines((tmp_path / "report.md").read_text()) == [f"- {expected}"]
    assert recompute_lines(capsys.readouterr().out) == [f"[converge] {expected}"]


@pytest.mark.parametrize(
    ("ort_training", "said"),
    [
        (SESSION, "none applied: the run record has no recompute entry"),
        ({**SESSION, "recompute": {"level": 0, "layers": [], "plans": {}, "recomputed_nodes": 0}}, "none applied ("),
        (None, "unknown ("),  # no ort.json at all
    ],
)
def test_a_level_without_recompute_is_a_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ort_training: dict[str, Any] | None,
    said: str,
) -> None:
    fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": REFERENCE}, ort_training)
    assert converge.run(parse(tmp_path, "--memory-opt-level", "1")) == 0  # the verdict is still the curves'
    for line in [*recompute_lines((tmp_path / "report.md").read_text()), *recompute_lines(capsys.readouterr().out)]:
        assert f"WARNING: ORT run at {MEMORY_OPT}=1, recompute: {said}" in line
        assert line.endswith("these curves do not test recompute")


def test_level_0_is_the_default_and_no_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(MEMORY_OPT, raising=False)
    off = {**RECOMPUTED, "level": 0, "layers": [], "plans": {}, "recomputed_nodes": 0}
    fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": REFERENCE}, {**SESSION, "recompute": off})
    assert converge.run(parse(tmp_path)) == 0
    line = f"ORT run at {MEMORY_OPT}=0, recompute: none applied (no region of the training graph is recomputed)"
    assert recompute_lines(capsys.readouterr().out) == [f"[converge] {line}"]


def test_a_bad_level_exits_2_before_any_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = fake_train(monkeypatch, {"--no-ort": REFERENCE, "--ort": REFERENCE})
    monkeypatch.setenv(MEMORY_OPT, "5")
    assert converge.run(parse(tmp_path)) == 2
    assert f"{MEMORY_OPT}='5'" in capsys.readouterr().err and calls == []
    with pytest.raises(SystemExit):
        parse(tmp_path, "--memory-opt-level", "3")


def test_a_precision_turns_on_its_section_in_a_copy_of_the_config(tmp_path: Path) -> None:
    """`--precision bf16`: the runs use the config with `"bf16": {"enabled": true}` (and no fp16 section), written
    beside the report; fp32 uses the config as it is; the default tolerance is two units in the last place."""
    config = tmp_path / "zero3.json"
    config.write_text(json.dumps({"fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 4}))
    assert converge.with_precision(config, "fp32", tmp_path) == config
    written = converge.with_precision(config, "bf16", tmp_path)
    assert written != config and written.parent == tmp_path
    assert json.loads(written.read_text()) == {"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 4}
    assert converge.DEFAULT_RTOL["bf16"] == 2 * 2**-7 and converge.DEFAULT_RTOL["fp16"] == 2 * 2**-10


SPIKE = [3.35, 3.29, 3.45, 3.07]  # the demo GPT's bf16 steps 10-13; reordered PyTorch 4.50 and ORT 4.20 at step 11


@pytest.mark.parametrize(
    ("ort", "reordered", "agree"),
    [
        ([3.35, 4.20, 3.48, 3.02], [3.35, 4.50, 3.44, 3.00], True),  # ORT parts where and as much as PyTorch does
        ([3.30, 4.58, 3.48, 3.01], [3.31, 4.50, 3.44, 3.00], True),  # a step early, as PyTorch's own parting begins
        ([3.35, 4.20, 3.48, 3.02], SPIKE, False),  # PyTorch reordered stays within the tolerance: ORT is apart
        ([4.20, 3.29, 3.45, 3.07], [3.35, 4.50, 3.44, 3.00], False),  # ORT parts where PyTorch has not moved
        ([3.35, 9.00, 3.48, 3.02], [3.35, 4.50, 3.44, 3.00], False),  # by more than twice PyTorch's own spread
    ],
    ids=["within the spread", "as the spread begins", "no spread", "earlier", "larger"],
)
def test_16_bit_runs_beyond_the_tolerance_agree_only_within_pytorchs_own_spread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    ort: list[float], reordered: list[float], agree: bool,
) -> None:  # fmt: skip
    """Beyond two bf16 ulps a step of ORT agrees only within twice what PyTorch with other threads parted by then."""
    calls = fake_train(monkeypatch, {"--no-ort": SPIKE, "--ort": ort, converge.REORDERED: reordered})
    assert converge.run(parse(tmp_path, "--precision", "bf16")) == (0 if agree else 1)
    assert [run_dir.name for _, run_dir in calls] == ["pytorch", "ort", converge.REORDERED]
    assert f"verdict: **{'agree' if agree else 'diverge'}**" in (report := (tmp_path / "report.md").read_text())
    assert "bf16's own spread" in report and len(table_rows(report)[0]) == 8  # the reordered run's loss and difference
    assert ("AGREE (within" if agree else "DIVERGE (beyond") + " bf16's own spread)" in capsys.readouterr().out
