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


def test_a_node_ort_has_no_kernel_for_is_one_line_naming_op_module_and_way_out() -> None:
    """ORT's own refusal at session creation (here of a bf16 Add on the CPU, the pass not run) is one line."""
    import onnxruntime
    import torch
    from onnx import TensorProto, helper

    import ort_zero  # noqa: F401  (before ORT's training package)
    from ort_zero.ort.ortmodule.graph_execution_manager import ort_refusals_named
    from ort_zero.ort.passes.half_precision_casts import UnsupportedOpError

    node = helper.make_node("Add", ["x", "y"], ["z"], name="/_original_module/model/layers.0/mlp/Add")
    graph = helper.make_graph(
        [node], "bf16", [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [2]) for n in ("x", "y")],
        [helper.make_tensor_value_info("z", TensorProto.BFLOAT16, [2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)

    class Manager:
        _device = torch.device("cpu")

        def _create_execution_agent(self) -> None:
            onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    with pytest.raises(UnsupportedOpError) as raised:
        ort_refusals_named(Manager._create_execution_agent)(Manager())
    message = str(raised.value)
    assert "\n" not in message and raised.value.__suppress_context__, message
    assert "no cpu kernel for Add" in message and "module 'model.layers.0.mlp'" in message, message
    assert "float32" in message, message


# One process: a session made with ORT's arena on (ort_zero's kernel probes make such sessions before a 16-bit model's
# session), then an ORTModule whose elementwise nodes (ORT's kernels, not torch's; in float32 for bf16) write values of
# 64 MiB in float32; prints what malloc still has handed out after the step, once the step's tensors are gone, and
# what the run record says. argv[1]: the input's dtype.
AN_EARLIER_SESSION_THEN_A_STEP = """
import json, sys
import numpy, onnxruntime, torch
from onnx import TensorProto, helper
import ort_zero
from ort_zero.ort.inspection import ort_run_record
from ort_zero.memory.footprint import malloced_bytes

ort_zero.enable_zero3()
from onnxruntime.training.ortmodule import ORTModule

value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
relu = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [value], [value])
relu.output[0].name = "y"
first = onnxruntime.InferenceSession(
    helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString(),
    providers=["CPUExecutionProvider"],
)
first.run(None, {"x": numpy.ones(4, numpy.float32)})


class Elementwise(torch.nn.Module):
    def forward(self, x):
        return (torch.relu(x * 2.0) * 3.0).sum()


model = ORTModule(Elementwise())
x = torch.randn(16 << 20, dtype=getattr(torch, sys.argv[1]), requires_grad=True)
before = malloced_bytes()
model(x).backward()
x.grad = None
kept = (malloced_bytes() - before) / 2**20
record = ort_run_record(model)["training"]
print(json.dumps({"kept_mib": kept, "arena": record["cpu_mem_arena"], "ort_ran": bool(record["session"])}))
"""


@pytest.mark.parametrize(
    ("chosen", "dtype", "kept"),
    [("0", "float32", False), ("1", "float32", True), (None, "float32", True), (None, "bfloat16", False)],
    ids=["off", "on", "float32 default: on", "bf16 default: off"],
)
def test_each_session_gets_the_arena_its_own_options_say(chosen: str | None, dtype: str, kept: bool) -> None:
    """onnxruntime-training made every session's CPU provider from the first session's options: after a session
    with the arena on (ort_zero's bf16 kernel probes), ORT_ZERO_CPU_MEM_ARENA=0 and the recompute's arena switch
    left the arena on while the run record said off (+476 MiB at the peak of a 4-layer bf16 LLaMA, seq 1024). A
    16-bit model's arena is off by default: its step peaks in DeepSpeed's optimizer step, which the arena's
    high-water mark would outlive."""
    env = {key: value for key, value in os.environ.items() if key != "ORT_ZERO_CPU_MEM_ARENA"}
    env |= {"ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"} | ({"ORT_ZERO_CPU_MEM_ARENA": chosen} if chosen else {})
    run = subprocess.run([sys.executable, "-c", AN_EARLIER_SESSION_THEN_A_STEP, dtype], env=env, timeout=300,
                         capture_output=True)  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    result = json.loads(run.stdout.decode().splitlines()[-1])
    assert result["ort_ran"] and result["arena"] is kept, result
    if kept:  # the arena keeps the step's 64 MiB values: what the measure sees when an arena holds them
        assert result["kept_mib"] > 128, result
    else:
        assert result["kept_mib"] < 32, result
