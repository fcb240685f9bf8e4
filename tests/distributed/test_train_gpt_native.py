"""ort_zero.examples.train_gpt end to end: 2 CPU ranks under torchrun, the GPT on the stdlib corpus.

Native DeepSpeed ZeRO-3 (the reference) learns and resumes from a checkpoint onto the same loss curve; the ORT path
(the demo's default) follows the native curve.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "ort_zero" / "examples" / "train_gpt.py"
CONFIG = ROOT / "ds_configs" / "zero3_cpu_fp32.json"
SMALL = ["--seq-len", "32", "--d-model", "64", "--n-layer", "2", "--n-head", "4", "--seed", "7"]
STEPS = 6


def train(out: Path, *args: str, config: Path = CONFIG, timeout: float = 400) -> list[dict[str, float]]:
    """Run the trainer on 2 ranks; the rows of its losses.csv."""
    argv = ["--deepspeed_config", str(config), "--output-dir", str(out), *SMALL, *args]
    run_launcher(torchrun_cmd(TRAINER, argv, port=free_port(), nproc=2), timeout=timeout, cwd=ROOT)
    with (out / "losses.csv").open(newline="") as handle:
        return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(handle)]


def losses(rows: list[dict[str, float]]) -> list[float]:
    return [row["loss"] for row in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, float]]]:
    out = tmp_path_factory.mktemp("straight")
    return out, train(out, "--native", "--steps", str(STEPS))


def test_native_run_writes_its_record_and_learns(straight: tuple[Path, list[dict[str, float]]]) -> None:
    out, rows = straight
    assert [int(row["step"]) for row in rows] == list(range(STEPS))
    assert all(math.isfinite(row["loss"]) and row["time_ms"] > 0 for row in rows)
    assert rows[0]["loss"] == pytest.approx(math.log(256), abs=0.5)  # an untrained byte model is near uniform
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3, f"the loss did not fall: {losses(rows)}"
    recorded = json.loads((out / "args.json").read_text())
    assert recorded["world_size"] == 2 and recorded["native"] and not recorded["ort"]


def test_resumed_run_continues_the_same_curve(
    tmp_path: Path, straight: tuple[Path, list[dict[str, float]]]
) -> None:
    _, reference = straight
    first = train(tmp_path, "--native", "--steps", str(STEPS // 2), "--save-every", str(STEPS // 2))
    assert (tmp_path / "checkpoints" / "latest").is_file()
    resumed = train(tmp_path, "--native", "--steps", str(STEPS), "--resume")
    assert losses(first) == pytest.approx(losses(reference)[: STEPS // 2], abs=1e-6)
    assert [int(row["step"]) for row in resumed] == list(range(STEPS))
    assert losses(resumed) == pytest.approx(losses(reference), abs=1e-6)


def test_ort_path_follows_the_native_curve(tmp_path: Path, straight: tuple[Path, list[dict[str, float]]]) -> None:
    """The default mode: ORTModule with ort_zero's ZeRO-3 hooks (fallback to PyTorch disabled by conftest)."""
    _, reference = straight
    rows = train(tmp_path, "--ort", "--steps", str(STEPS), timeout=500)
    assert json.loads((tmp_path / "args.json").read_text())["ort_zero_enabled"]
    assert losses(rows) == pytest.approx(losses(reference), rel=1e-5, abs=1e-6)
