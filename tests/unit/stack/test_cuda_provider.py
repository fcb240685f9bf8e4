"""No silent CPU run: ORT's fall back from an unloadable CUDA provider is refused, naming what failed to load.

On this CPU machine the provider cannot load (its CUDA 11 libraries are absent from an empty ORT_ZERO_CUDA_HOME),
which is exactly the failure ORT hides; the session is built in a child process because a CUDA provider that does
load without a driver aborts its process.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ort_zero import patches
from ort_zero.stack.cuda_provider import CudaProviderMissingError, cuda_provider_required

FELL_BACK_SESSION = """
import onnxruntime
from onnx import TensorProto, helper
from ort_zero.stack.cuda_provider import require_cuda_provider
vector = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [4]) for name in ("x", "y")]
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", vector[:1], vector[1:])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
session = onnxruntime.InferenceSession(
    model.SerializeToString(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
)
print("providers", session.get_providers())
require_cuda_provider(session, "cuda:0")
"""


def test_a_session_that_fell_back_to_the_cpu_provider_is_refused(tmp_path: Path) -> None:
    env = dict(os.environ, ORT_ZERO_CUDA_HOME=str(tmp_path))
    child = subprocess.run([sys.executable, "-c", FELL_BACK_SESSION], capture_output=True, text=True, env=env,
                           timeout=300)  # fmt: skip
    assert "providers ['CPUExecutionProvider']" in child.stdout, child.stdout + child.stderr
    assert child.returncode == 1
    error = child.stderr.strip().splitlines()[-1]
    assert error.startswith("ort_zero.stack.cuda_provider.CudaProviderMissingError: the model is on cuda:0 but")
    assert "libcublasLt.so.11 (needed by libonnxruntime_providers_cuda.so)" in error
    assert "'ORT_ZERO_CUDA=1 launch/bootstrap.sh'" in error


class Session:
    def __init__(self, providers: list[str]) -> None:
        self.providers = providers

    def get_providers(self) -> list[str]:
        return self.providers


@pytest.mark.parametrize(
    ("device", "providers", "refused"),
    [
        ("cuda", ["CPUExecutionProvider"], True),
        ("cuda", ["CUDAExecutionProvider", "CPUExecutionProvider"], False),
        ("cpu", ["CPUExecutionProvider"], False),
    ],
)
def test_the_check_runs_after_ortmodule_creates_its_session(device: str, providers: list[str], refused: bool) -> None:
    created = []

    def create_execution_agent(self: SimpleNamespace) -> None:
        self._execution_agent = SimpleNamespace(_inference_session=Session(providers))
        created.append(True)

    replacement = cuda_provider_required(create_execution_agent)
    target = SimpleNamespace(_device=SimpleNamespace(type=device))
    if refused:
        with pytest.raises(CudaProviderMissingError, match=r"ONNX Runtime runs it on \['CPUExecutionProvider'\]"):
            replacement(target)
    else:
        replacement(target)
    assert created == [True]


def test_declared_for_both_ortmodule_managers() -> None:
    declared = {p.owner_path: p for p in patches.registered() if p.name.startswith("ort.cuda_provider_required")}
    owners = "onnxruntime.training.ortmodule._training_manager", "onnxruntime.training.ortmodule._inference_manager"
    assert set(declared) == {f"{owners[0]}:TrainingManager", f"{owners[1]}:InferenceManager"}
    for patch in declared.values():
        original = getattr(patch.owner(), patch.attribute)
        assert inspect.unwrap(patch.make_replacement(original)) is original
