"""The grouped_conv_1d pass: ORT 1.19.2's ConvGrad zero-fills memory past the end of dX for a grouped Conv whose
kernel has one spatial axis (the depthwise causal convolution of the linear-attention types); the pass exports such
a Conv as the same Conv over two axes, which ORT differentiates within its buffers. The overrun itself is seen in
child processes with ORT's arena off (glibc then owns every ORT buffer and aborts on the damage), with glibc's
malloc checks where the system has them."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import ort_zero  # noqa: F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.passes import grouped_conv_1d, pipeline
from ort_zero.ort.passes.base import ExportedGraph

FLOAT = onnx.TensorProto.FLOAT
MALLOC_DEBUG = Path("/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so")
ROOT = Path(__file__).resolve().parents[4]

CONV_GRAD = """
import sys, numpy as np, onnxruntime as ort
from onnx import helper, TensorProto
two_axes = sys.argv[1] == "2"
C, L, K = 8, 16, 4
x, w, y = ([2, C, 1, L], [C, 1, 1, K], [2, C, 1, L - K + 1]) if two_axes else ([2, C, L], [C, 1, K], [2, C, L - K + 1])
if two_axes:
    spatial = dict(kernel_shape=[1, K], strides=[1, 1], pads=[0, 0, 0, 0])
else:
    spatial = dict(kernel_shape=[K], strides=[1], pads=[0, 0])
node = helper.make_node("ConvGrad", ["dY", "X", "W"], ["dX", "dW", "dB"], domain="com.microsoft", group=C, **spatial)
inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("dY", y), ("X", x), ("W", w))]
outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("dX", "dW", "dB")]
opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
model = helper.make_model(helper.make_graph([node], "g", inputs, outputs), opset_imports=opsets, ir_version=8)
options = ort.SessionOptions()
options.enable_cpu_mem_arena = False
session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
for _ in range(4):
    feeds = {n: rng.standard_normal(s, dtype=np.float32) for n, s in (("dY", y), ("X", x), ("W", w))}
    session.run(None, feeds)
"""

TRAIN = """
import sys, torch
import ort_zero
from ort_zero.ort.passes import grouped_conv_1d, pipeline
from onnxruntime.training.ortmodule import ORTModule
sys.path.insert(0, sys.argv[2])
from test_grouped_conv_1d import DepthwiseCausalConv
if sys.argv[1] == "without":
    pipeline.EXPORT_PASSES = tuple(p for p in pipeline.EXPORT_PASSES if p is not grouped_conv_1d.PASS)
ort_zero.enable_zero3()
torch.manual_seed(0)
model = ORTModule(DepthwiseCausalConv())
for _ in range(4):
    model(torch.randn(4, 8)).backward()
"""


class DepthwiseCausalConv(torch.nn.Module):
    """A depthwise causal Conv1d (padded on the left, as the linear attention's) between Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(8, 64), torch.nn.Linear(64, 8)
        self.conv = torch.nn.Conv1d(8, 8, kernel_size=4, groups=8, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x).view(-1, 8, 8)
        h = self.conv(torch.nn.functional.pad(h, (3, 0)))
        return self.outer(h.reshape(-1, 64)).square().mean()


def _child(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "ORT_ZERO_CPU_MEM_ARENA": "0",
        "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    if MALLOC_DEBUG.exists():
        env.update(MALLOC_CHECK_="3", LD_PRELOAD=str(MALLOC_DEBUG))
    command = [sys.executable, "-c", script, *args]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, check=False, preexec_fn=_no_core_file
    )


def _no_core_file() -> None:
    """The children that abort on the overrun leave no core file behind."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def test_ort_conv_grad_overruns_dx_of_a_grouped_one_axis_conv_only() -> None:
    assert _child(CONV_GRAD, "1").returncode != 0, "ORT's ConvGrad no longer overruns dX: the pass may be obsolete"
    two_axes = _child(CONV_GRAD, "2")
    assert two_axes.returncode == 0, two_axes.stderr[-2000:]


def test_a_depthwise_conv1d_trains_in_ort_within_its_buffers() -> None:
    with_pass = _child(TRAIN, "with", str(Path(__file__).parent))
    assert with_pass.returncode == 0, with_pass.stderr[-2000:]
    assert _child(TRAIN, "without", str(Path(__file__).parent)).returncode != 0


def test_trains_in_ort_as_pytorch(trains_as_pytorch: Callable[..., None]) -> None:
    trains_as_pytorch(DepthwiseCausalConv)


def _conv_model(group: int, pads: list[int]) -> onnx.ModelProto:
    conv = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], name="conv", group=group, kernel_shape=[3], pads=pads, strides=[2]
    )
    graph = helper.make_graph(
        [conv, helper.make_node("Relu", ["y"], ["z"], name="relu")],
        "g",
        [
            helper.make_tensor_value_info("x", FLOAT, [2, 4, 9]),
            helper.make_tensor_value_info("w", FLOAT, [4, 4 // group, 3]),
            helper.make_tensor_value_info("b", FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("z", FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_widens_a_grouped_one_axis_conv_to_the_same_values() -> None:
    model = _conv_model(group=4, pads=[2, 1])
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 4, 9), np.float32), "w": rng.standard_normal((4, 1, 3), np.float32)}
    feeds["b"] = rng.standard_normal(4, np.float32)
    expected = _run(model, feeds)
    report = grouped_conv_1d.run(ExportedGraph(model, torch.nn.Module(), training=True, mem_efficient_grads=False))
    assert report.widened == ["conv"]
    assert [n.op_type for n in model.graph.node] == ["Unsqueeze", "Unsqueeze", "Conv", "Squeeze", "Relu"]
    conv = model.graph.node[2]
    attributes = {a.name: list(a.ints) for a in conv.attribute if a.ints}
    assert attributes == {"kernel_shape": [1, 3], "pads": [0, 2, 0, 1], "strides": [1, 2]}
    np.testing.assert_array_equal(_run(model, feeds), expected)


def test_leaves_ungrouped_convs_to_ort() -> None:
    model = _conv_model(group=1, pads=[1, 1])
    report = grouped_conv_1d.run(ExportedGraph(model, torch.nn.Module(), training=True, mem_efficient_grads=False))
    assert report.widened == []
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu"]


def test_runs_before_the_passes_that_rename_parameters() -> None:
    names = [p.name for p in pipeline.EXPORT_PASSES]
    assert names.index("grouped_conv_1d") < names.index("zero3_params")


@pytest.mark.parametrize("opset", [11, 17])
def test_axes_follow_the_opset(opset: int) -> None:
    model = _conv_model(group=4, pads=[0, 0])
    model.opset_import[0].version = opset
    grouped_conv_1d.run(ExportedGraph(model, torch.nn.Module(), training=True, mem_efficient_grads=False))
    unsqueeze = model.graph.node[0]
    assert (len(unsqueeze.input) == 2) == (opset >= 13)


def test_a_grouped_conv_over_three_axes_is_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """ORT's overrun is the same on a three-axis kernel, which the pass leaves: loud, not silent."""
    model = _conv_model(group=4, pads=[0, 0])
    conv = model.graph.node[0]
    del conv.attribute[:]
    conv.attribute.extend([helper.make_attribute("group", 4), helper.make_attribute("kernel_shape", [1, 1, 3])])
    with caplog.at_level("WARNING", logger=grouped_conv_1d.__name__):
        report = grouped_conv_1d.run(ExportedGraph(model, torch.nn.Module(), training=True, mem_efficient_grads=False))
    assert report.widened == []
    assert "grouped Convs over three spatial axes (conv)" in caplog.text
