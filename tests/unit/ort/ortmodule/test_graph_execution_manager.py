"""ORTModule's session configuration with ort_zero's replacements (`ort_zero.ort.ortmodule.graph_execution_manager`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# One process that trains a step in ORT and exits without freeing its ORTModule, as a training script does.
TRAIN_A_STEP = """
import torch
import ort_zero
from ort_zero.ort.inspection import ort_run_record

ort_zero.enable_zero3()
from onnxruntime.training.ortmodule import ORTModule

model = ORTModule(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
model(torch.randn(4, 8)).sum().backward()
assert ort_run_record(model)["training"]["session"], "no ORT session"
"""


# ORT's probe of its memory optimizer (a session built first and freed) outlasting a second, as on a loaded machine.
SLOW_MEMORY_PROBE = """
import time
from onnxruntime.training.ortmodule._runtime_inspector import MemoryObserver

probe = MemoryObserver.find_memory_optimization_opportunity
MemoryObserver.find_memory_optimization_opportunity = lambda *args: (time.sleep(1.1), probe(*args))[1]
"""


@pytest.mark.parametrize("probe", ["", SLOW_MEMORY_PROBE], ids=["probe as is", "probe outlasting a second"])
def test_each_ranks_profile_is_written_when_the_process_exits(tmp_path: Path, probe: str) -> None:
    """ORT writes a profile when its session ends; ORTModule's lived until exit unfreed and the file stayed empty.
    Ranks started in the same second wrote one file name; the memory optimizer's probe session wrote a second file
    (profiles are named by their start, to the second)."""
    env = {**os.environ, "ORT_ZERO_ORT_PROFILE": str(tmp_path / "profile"), "RANK": "1",
           "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"}  # fmt: skip
    script = TRAIN_A_STEP.replace("ort_zero.enable_zero3()", "ort_zero.enable_zero3()" + probe)
    run = subprocess.run([sys.executable, "-c", script], env=env, timeout=300, capture_output=True)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    [profile] = tmp_path.glob("profile_rank1_*.json")
    ops = {event["args"].get("op_name") for event in json.loads(profile.read_text()) if event.get("cat") == "Node"}
    assert {"Gemm", "ReluGrad"} <= ops, sorted(op for op in ops if op)  # the forward's and the backward's nodes
