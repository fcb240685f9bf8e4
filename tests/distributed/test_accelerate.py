"""accelerate under ORT-ZeRO3, through the real `accelerate launch` with its DeepSpeed plugin at ZeRO stage 3 (no
DeepSpeed JSON), 2 CPU ranks; each job natively and in ORT, per-step losses within 1e-5:

- a plain accelerate loop (`prepare`, `accelerator.backward`), whose one changed line is
  `ORTZeroAccelerator as Accelerator` (scripts/accelerate_loop.py), with accelerate's CLI flags;
- `ORTZeroTrainer` (the example, ort_zero.examples.train_hf, without --deepspeed) with accelerate's config file
  (ds_configs/accelerate_zero3_cpu.yaml), as `--deepspeed` trains it.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from launcher import BIN, free_port, run_launcher
from parity import ulp

ROOT = Path(__file__).resolve().parents[2]
LOOP = Path(__file__).parent / "scripts" / "accelerate_loop.py"
CONFIG = ROOT / "ds_configs" / "accelerate_zero3_cpu.yaml"
STEPS = 6
TOLERANCE = 1e-5
TIMEOUT = 300
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}
CLI_PLUGIN = ["--use_deepspeed", "--zero_stage", "3", "--num_processes", "2", "--num_machines", "1"]


def accelerate_launch(options: list[str], program: list[str]) -> None:
    argv = [str(BIN / "accelerate"), "launch", *options, "--main_process_port", str(free_port()), *program]
    run_launcher(argv, timeout=TIMEOUT, cwd=ROOT)


def losses(out: Path) -> list[float]:
    with (out / "losses.csv").open(newline="") as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]


def assert_ran_in_ort_with_native_losses(native: Path, ort: Path, precision: str = "no") -> None:
    training = json.loads((ort / "ort.json").read_text())["training"]
    assert training["session"] and BRIDGES <= set(training["python_ops"]), training
    assert bool(training["float32_fallbacks"]) == (precision == "bf16"), training  # the graph is bf16, or fp32
    reference, result = losses(native), losses(ort)
    assert len(reference) == len(result) == STEPS
    for step, (expected, got) in enumerate(zip(reference, result, strict=True)):
        tolerance = TOLERANCE if precision == "no" else 2 * ulp(expected, precision)  # test_precision.py: why
        assert abs(got - expected) <= tolerance, f"step {step}: ORT {got} vs native {expected}"
    assert reference[-1] < reference[0] - 0.1, f"the native run did not learn, the test proves nothing: {reference}"


@pytest.mark.extended  # 2 launches, ~95 s on 2 shared cores
@pytest.mark.parametrize("precision", ["no", "bf16"])  # accelerate's --mixed_precision: DeepSpeed's bf16 section
def test_an_accelerate_loop_in_ort_follows_native(tmp_path: Path, precision: str) -> None:
    for mode in ("native", "ort"):
        program = [str(LOOP), "--out", str(tmp_path / mode), "--steps", str(STEPS)]
        options = [*CLI_PLUGIN, "--mixed_precision", precision]
        accelerate_launch(options, program + (["--ort"] if mode == "ort" else []))
    assert_ran_in_ort_with_native_losses(tmp_path / "native", tmp_path / "ort", precision)


@pytest.mark.extended  # 2 launches, ~90 s
def test_ortzerotrainer_under_accelerates_plugin_follows_the_trainer(tmp_path: Path) -> None:
    for mode in ("native", "ort"):
        program = ["-m", "ort_zero.examples.train_hf", "--model-type", "llama", "--max-steps", str(STEPS)]
        program += ["--output-dir", str(tmp_path / mode)] + (["--no-ort"] if mode == "native" else [])
        accelerate_launch(["--config_file", str(CONFIG)], program)
    assert_ran_in_ort_with_native_losses(tmp_path / "native", tmp_path / "ort")
    for mode in ("native", "ort"):  # each rank trained on its own batches, the model partitioned as it was built
        assert json.loads((tmp_path / mode / "result.json").read_text())["trainer_world_size"] == 2
        assert json.loads((tmp_path / mode / "zero_init.json").read_text())["local_numel"] == 0
