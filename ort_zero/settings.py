"""Process-wide settings that the switches in `api.py` write and the lower layers (ORT passes) read."""

from __future__ import annotations

import os

# Hand each parameter gradient to PyTorch through `param.backward(grad)` as soon as ORT computes it.
mem_efficient_grads = False

# Layer-wise recompute of ZeRO-3 models in ORT (ORTMODULE_MEMORY_OPT_LEVEL's levels); None: read the variable.
recompute_level_override: int | None = None

RECOMPUTE_LEVELS = (0, 1, 2)


def recompute_level() -> int:
    """The memory-optimization level ort_zero applies to ZeRO-3 training graphs in ORT.

    0: no recompute; 1: each transformer layer is recomputed in the backward from its input (what PyTorch's
    per-layer gradient checkpointing does); 2: level 1, and the model's other modules too.
    """
    if recompute_level_override is not None:
        return recompute_level_override
    raw = os.environ.get("ORTMODULE_MEMORY_OPT_LEVEL", "0").strip() or "0"
    if raw not in {str(level) for level in RECOMPUTE_LEVELS}:
        raise ValueError(f"ORTMODULE_MEMORY_OPT_LEVEL={raw!r}: use 0 (off), 1 (layer-wise recompute) or 2")
    return int(raw)


def trim_heap() -> bool:
    """Whether glibc's heap hands its free pages back to the OS at each layer's boundary and after each forward and
    backward of an ORT session on CPU (ORT_ZERO_TRIM_HEAP, default 1; why: `ort_zero.memory.heap`)."""
    return _switch("ORT_ZERO_TRIM_HEAP", "trim, the default")


def output_pool() -> bool:
    """Whether the linear layers ORT runs in torch on CPU write their outputs and kept inputs into buffers kept from
    step to step (ORT_ZERO_OUTPUT_POOL, default 1; why: `ort_zero.memory.output_pool`)."""
    return _switch("ORT_ZERO_OUTPUT_POOL", "keep the buffers, the default")


def cpu_mem_arena() -> bool | None:
    """Whether ORT's sessions keep their CPU arena (ORT_ZERO_CPU_MEM_ARENA 1 or 0); None when unset: ort_zero
    decides per session (`ort_zero.memory.arena`)."""
    if not os.environ.get("ORT_ZERO_CPU_MEM_ARENA", "").strip():
        return None
    return _switch("ORT_ZERO_CPU_MEM_ARENA", "keep it in every session")


def check_passes() -> bool:
    """Whether each graph pass is checked to edit the graph only as it declares (ORT_ZERO_CHECK_PASSES=1; off by
    default: the check snapshots every node before and after each pass, which costs an export time; the tests turn
    it on)."""
    raw = os.environ.get("ORT_ZERO_CHECK_PASSES", "0").strip() or "0"
    if raw not in {"0", "1"}:
        raise ValueError(f"ORT_ZERO_CHECK_PASSES={raw!r}: use 1 (check every pass's edits) or 0")
    return raw == "1"


def check_environment() -> None:
    """Read every setting once, so a bad value stops `enable_zero3` rather than a step inside ORT."""
    recompute_level()
    trim_heap()
    output_pool()
    cpu_mem_arena()
    check_passes()


def _switch(variable: str, what_1_does: str) -> bool:
    """An on/off variable, on by default."""
    raw = os.environ.get(variable, "1").strip() or "1"
    if raw not in {"0", "1"}:
        raise ValueError(f"{variable}={raw!r}: use 1 ({what_1_does}) or 0")
    return raw == "1"
