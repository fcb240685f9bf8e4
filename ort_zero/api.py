"""The switches users call: `enable_zero3`, `disable_zero3`, `enable_mem_efficient_grads`."""

from __future__ import annotations

import importlib.util
import logging
import os

from . import patch_groups, patches, settings
from .ort_import import prepare_for_ort

logger = logging.getLogger(__name__)

_ZERO3_ENV = "ORTMODULE_ENABLE_ZERO_STAGE3"
_MEM_GRAD_ENV = "ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT"


def enable_zero3(mem_efficient_grads: bool | None = None) -> None:
    """Route DeepSpeed ZeRO-3 through ort_zero's hooks; with onnxruntime-training installed, ORTModule too.

    Call before `deepspeed.initialize` (and before wrapping with ORTModule). Idempotent. From then on the process
    group ends in order when the interpreter exits (`ort_zero.distributed.shut_down_at_exit`). `mem_efficient_grads`
    hands each parameter gradient to PyTorch as soon as ORT computes it; None keeps the current setting (or ORT's
    ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT=1).
    """
    settings.check_environment()
    prepare_for_ort()
    patches.apply_group(patch_groups.ZERO3)
    from .distributed import quiet_deprecated_collectives, shut_down_at_exit  # imports DeepSpeed: not at import

    shut_down_at_exit()  # the process group (ort_zero's, DeepSpeed's or the Trainer's) ends in order at exit
    quiet_deprecated_collectives()
    if ort_training_installed():
        if "ORTMODULE_FALLBACK_POLICY" not in os.environ:
            # ORTModule's default silently runs PyTorch after an export error: numbers look right, nothing ran in ORT.
            os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
            logger.info("ort_zero: ORTModule fallback to PyTorch disabled (set ORTMODULE_FALLBACK_POLICY to allow)")
        patches.apply_group(patch_groups.ORT)
    else:
        logger.warning("ort_zero: onnxruntime-training is not installed; ZeRO-3 runs through ort_zero in PyTorch only")
    if mem_efficient_grads is not None:
        enable_mem_efficient_grads(mem_efficient_grads)
    elif os.environ.get(_MEM_GRAD_ENV) == "1":
        enable_mem_efficient_grads(True)


def disable_zero3() -> None:
    """Restore every DeepSpeed and ORT symbol ort_zero replaced. Engines created meanwhile keep their hooks."""
    patches.revert_group(patch_groups.ORT)
    patches.revert_group(patch_groups.ZERO3)
    settings.mem_efficient_grads = False


def is_zero3_enabled() -> bool:
    return patches.is_applied("deepspeed.setup_zero_stage3_hooks")


def enable_mem_efficient_grads(enabled: bool = True) -> None:
    """Make ORTModule graphs hand each parameter gradient over through `param.backward(grad)` as it is computed."""
    if not ort_training_installed():
        raise RuntimeError("memory-efficient gradients need onnxruntime-training, which is not installed")
    settings.mem_efficient_grads = enabled
    if enabled:
        patches.apply_group(patch_groups.ORT)


def ort_training_installed() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None and (
        importlib.util.find_spec("onnxruntime.training") is not None
    )


def enable_from_environment() -> None:
    """Honour ORT's own switch: with ORTMODULE_ENABLE_ZERO_STAGE3=1, ort_zero is enabled once ONNX Runtime is
    imported (after `import ort_zero`)."""
    if os.environ.get(_ZERO3_ENV) == "1":
        enable_zero3()
