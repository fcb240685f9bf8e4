"""Process-wide settings that the switches in `api.py` write and the lower layers (ORT passes) read."""

from __future__ import annotations

# Hand each parameter gradient to PyTorch through `param.backward(grad)` as soon as ORT computes it.
mem_efficient_grads = False
