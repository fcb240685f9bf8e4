"""No silent CPU run: a model on CUDA whose ORT session did not get the CUDA provider is an error.

When ORT cannot load or start its CUDA provider it logs the failure and builds the session on the CPU provider
(sometimes announcing "Falling back to ['CPUExecutionProvider']", sometimes not even that); ORTModule then trains a
CUDA model on the CPU, copying every input and output across, and nothing says so. The replacement below checks the
session ORTModule just created, like the refusal of a fallback to PyTorch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..foreign import onnxruntime as ort_internals
from . import cuda_libraries

CUDA_PROVIDER = "CUDAExecutionProvider"


class CudaProviderMissingError(RuntimeError):
    """ORTModule's model is on a CUDA device but ORT's session runs without the CUDA provider."""


def cuda_provider_required(original: Callable) -> Callable:
    """Replaces `TrainingManager/InferenceManager._create_execution_agent`: check the session it created."""

    @functools.wraps(original)
    def _create_execution_agent(self: Any) -> None:
        original(self)
        device = ort_internals.device(self)
        if getattr(device, "type", device) == "cuda":
            require_cuda_provider(ort_internals.session(self), str(device))

    return _create_execution_agent


def require_cuda_provider(session: Any, device: str) -> None:
    """Raise, naming what failed, unless `session` (an onnxruntime.InferenceSession) runs on the CUDA provider."""
    providers = session.get_providers()
    if providers and providers[0] == CUDA_PROVIDER:
        return
    raise CudaProviderMissingError(
        f"the model is on {device} but ONNX Runtime runs it on {providers}: {why_cuda_provider_failed()}. "
        "Run 'ort-zero doctor' for the whole CUDA side."
    )


def why_cuda_provider_failed() -> str:
    """The first missing piece, read off the machine: a library the provider needs, or the driver."""
    try:
        missing = cuda_libraries.unresolved(cuda_libraries.resolve())
    except (OSError, ValueError, RuntimeError) as error:
        return f"ORT's CUDA provider library cannot be read ({error})"
    if missing:
        return (
            f"ORT's CUDA provider could not load, {len(missing)} libraries are not found ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}); install them with '{cuda_libraries.INSTALL_COMMAND}'"
        )
    if not cuda_libraries.driver_present():
        return "the NVIDIA driver's libcuda.so.1 cannot be loaded: install the NVIDIA driver"
    if not cuda_libraries.preloaded():
        return (
            "the CUDA 11 libraries are installed but were not loaded before ORT's provider: import ort_zero before "
            "onnxruntime"
        )
    return (
        "ORT's CUDA provider loaded its libraries but could not start on this GPU (ORT's own error is logged above; "
        "the driver must support CUDA 11.8)"
    )
