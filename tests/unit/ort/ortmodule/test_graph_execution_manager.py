"""ORTModule's session configuration with ort_zero's replacements (`ort_zero.ort.ortmodule.graph_execution_manager`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_each_ranks_profile_is_written_when_the_process_exits(tmp_path: Path) -> None:
    """ORT writes a profile when its session ends; ORTModule's lived until exit unfreed and the file stayed empty.
    Ranks started in the same second wrote one file name."""
    env = {**os.environ, "ORT_ZERO_ORT_PROFILE": str(tmp_path / "profile"), "RANK": "1",
           "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"}  # fmt: skip
    subprocess.run([sys.executable, "-c", TRAIN_A_STEP], env=env, check=True, timeout=300, capture_output=True)
    [profile] = tmp_path.glob("profile_rank1_*.json")
    ops = {event["args"].get("op_name") for event in json.loads(profile.read_text()) if event.get("cat") == "Node"}
    assert {"Gemm", "ReluGrad"} <= ops, sorted(op for op in ops if op)  # the forward's and the backward's nodes
