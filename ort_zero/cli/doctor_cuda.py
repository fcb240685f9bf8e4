"""`ort-zero doctor` on GPU hosts: the NVIDIA driver, the libraries ORT's CUDA provider needs, the GPU allocator
extension, and an ORT session that must run on the CUDA provider."""

from __future__ import annotations

import importlib
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .doctor_report import Report

EXTENSIONS_PACKAGE = "onnxruntime.training.ortmodule.torch_cpp_extensions"


def cuda_lines(report: Report) -> list[str]:
    """GPU hosts: driver, every library ORT's CUDA provider needs and where it resolves, the GPU allocator extension,
    and on a GPU a one-node ORT session that must run on the CUDA provider."""
    from ort_zero.stack import cuda_libraries, extensions

    fix = cuda_libraries.INSTALL_COMMAND
    if not cuda_libraries.wanted():
        return ["no NVIDIA driver (libcuda.so.1 not found): nothing to check; ORT runs on its CPU provider"]
    driver = cuda_libraries.driver_present()
    lines = ["NVIDIA driver: libcuda.so.1 loads" if driver else "no NVIDIA driver; checked because ORT_ZERO_CUDA=1"]
    report_by_library = cuda_libraries.resolve()
    provider = cuda_libraries.PROVIDER
    for needed, path in report_by_library[provider].items():
        if path is None or not str(path).startswith(("/lib", "/usr/lib")):  # the system's own libc etc. are not news
            lines.append(f"{provider} needs {needed}: {path or 'NOT FOUND'}")
    missing = cuda_libraries.unresolved(report_by_library)
    if missing:
        report.problem(f"not found: {', '.join(missing)} (run '{fix}')")
    lines.append(f"{len(report_by_library)} libraries checked, {len(missing)} not found ({cuda_libraries.home()})")
    if extensions.missing_extensions("cuda"):  # a problem already, in the onnxruntime-training line
        lines.append(f"torch_gpu_allocator NOT built (run '{fix}')")
    else:
        importlib.import_module(f"{EXTENSIONS_PACKAGE}.torch_gpu_allocator")
        lines.append("torch_gpu_allocator built and loads")
    if driver and not missing:
        lines.append(cuda_session_line(report))
    return lines


def cuda_session_line(report: Report) -> str:
    """A one-node ORT session on GPU 0, in a child process: a CUDA provider that cannot start may abort it."""
    code = "from ort_zero.cli.doctor_cuda import print_cuda_session_providers; print_cuda_session_providers()"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if child.returncode != 0:
        reason = (child.stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
        report.problem(f"an ORT session on the GPU failed ({reason})")
        return f"ORT session on cuda:0 FAILED: {reason}"
    return f"ORT session on cuda:0 runs on {child.stdout.strip().splitlines()[-1]}"


def print_cuda_session_providers() -> None:
    """Run Relu on cuda:0 in ORT; raises (naming what failed to load) unless the CUDA provider runs it."""
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper

    from ort_zero.stack.cuda_provider import CUDA_PROVIDER, require_cuda_provider

    vector = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [4]) for name in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", vector[:1], vector[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    providers = [CUDA_PROVIDER, "CPUExecutionProvider"]
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=providers)
    require_cuda_provider(session, "cuda:0")
    session.run(None, {"x": np.array([-1.0, 0.0, 1.0, 2.0], dtype=np.float32)})
    print(session.get_providers()[0])
