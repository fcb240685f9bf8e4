"""ORTModule 1.19.2 on today's torch: applied when ort_zero is imported, since ORTModule cannot even be imported without
them (users import it right after ort_zero). They touch torch only. Why: ort_zero/ort/ortmodule/torch_compat.py."""

from __future__ import annotations

from ..ort.ortmodule import torch_compat
from ..patch_groups import TORCH_ONNX
from .declare import torch_patch

_TS_MOVED = "torch >= 2.9 moved the TorchScript exporter's private modules under torch.onnx._internal." + (
    "torchscript_exporter; ORTModule imports them from the old place"
)
for _name, _owner, _attribute, _replacement in [
    ("torch.onnx.jit_utils", "torch.onnx._internal", "jit_utils", torch_compat.moved_module("jit_utils")),
    ("torch.onnx._globals", "torch.onnx", "_globals", torch_compat.moved_module("_globals")),
    ("torch.onnx._type_utils", "torch.onnx", "_type_utils", torch_compat.moved_module("_type_utils")),
    ("torch.onnx.symbolic_opset9._convolution", "torch.onnx.symbolic_opset9", "_convolution",
     torch_compat.moved_function("symbolic_opset9", "_convolution")),
    ("torch.onnx.symbolic_opset9._convolution_mode", "torch.onnx.symbolic_opset9", "_convolution_mode",
     torch_compat.moved_function("symbolic_opset9", "_convolution_mode")),
]:  # fmt: skip
    torch_patch(TORCH_ONNX, _name, _owner, _attribute, _TS_MOVED, _replacement, adds=True)
torch_patch(
    TORCH_ONNX, "torch.onnx.export_for_ort", "torch.onnx", "export",
    "torch >= 2.9 exports with dynamo by default, which makes no PythonOps, and ORT does not pass dynamo=False: called "
    "from ONNX Runtime's own modules, dynamo is off unless asked for; every other caller keeps torch's default.",
    torch_compat.torchscript_export_for_ort,
)  # fmt: skip
