"""Where torch's kernels replace ORT's for speed alone: the linear layers, the loss and a 16-bit model's SiLU and
products were measured faster in torch than in ORT on the CPU only (ORT 1.19.2's CPU MatMul 1.26-1.34x torch's time,
its SoftmaxCrossEntropyLoss 3x, no 16-bit Mul or QuickGelu kernel; docs/benchmarks.md). On CUDA ORT's own kernels
stay until a measurement there says otherwise. Attention and experts run in torch for memory, on every device."""

from __future__ import annotations

import torch

FASTER_IN_TORCH_ON = frozenset({"cpu"})


def faster_in_torch(tensor: torch.Tensor) -> bool:
    """Whether a speed-only replacement applies to a computation on `tensor`'s device."""
    return tensor.device.type in FASTER_IN_TORCH_ON
