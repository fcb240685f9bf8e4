"""Whether an ORT session keeps its CPU arena.

ORT's CPU arena never hands memory back: it holds a step's high-water mark through DeepSpeed's optimizer step. Where
the layer-wise recompute lowers that mark, and where a 16-bit model's step peaks, the arena would hold the very peak
ort_zero lowered (measured in docs/benchmarks.md, "bf16"); like torch's CPU tensors, ORT's then come from glibc's
heap, whose trims hand them back (`heap`). ORT_ZERO_CPU_MEM_ARENA=0/1 chooses for every session.
"""

from __future__ import annotations

from .. import settings


def cpu_arena_kept(on_cpu: bool, recomputes_layers: bool, sixteen_bit: bool) -> tuple[bool, str]:
    """Whether a session keeps its CPU arena, and why not ("" when it does or the setting chose)."""
    if (chosen := settings.cpu_mem_arena()) is not None:
        return chosen, ""
    if not on_cpu:
        return True, ""
    because = "the graph recomputes layers" if recomputes_layers else "the model is 16-bit" if sixteen_bit else ""
    return not because, because
