"""TRL's trainers in ONNX Runtime under DeepSpeed ZeRO-3: `ORTSFTTrainer` and `ORTDPOTrainer`.

    from ort_zero.integrations.trl import ORTSFTTrainer as SFTTrainer  # the one changed line

Each is the TRL trainer with `ORTZeroTrainer` before it in the bases (`class ORTSFTTrainer(ORTZeroTrainer,
SFTTrainer)` in a script does the same): the policy model runs in ORT, a reference model in PyTorch on ort_zero's
ZeRO-3 hooks (it is not trained). TRL computes the per-token log-probabilities in an autograd Function
(`ChunkedLogProbFunction`, inside the model's forward), which ort_zero exports as a PythonOp
(ort_zero/ort/export/autograd.py). DPO of a PEFT model needs a `ref_model` (refused without one: the reference would
be the same model run in PyTorch between ORT's forward and backward, which gives wrong values).
"""

from __future__ import annotations

import inspect
from typing import Any

from trl import DPOTrainer, SFTTrainer

from .hf_trainer import ORTZeroTrainer, UnsupportedInORT


class ORTSFTTrainer(ORTZeroTrainer, SFTTrainer):
    """TRL's `SFTTrainer` whose DeepSpeed ZeRO-3 engine runs the model in ONNX Runtime."""


class ORTDPOTrainer(ORTZeroTrainer, DPOTrainer):
    """TRL's `DPOTrainer` whose DeepSpeed ZeRO-3 engine runs the policy model in ONNX Runtime."""

    def __init__(self, *positional: Any, **kwargs: Any) -> None:
        bound = inspect.signature(DPOTrainer.__init__).bind(None, *positional, **kwargs).arguments
        if _is_peft(bound.get("model")) and bound.get("ref_model") is None:
            raise UnsupportedInORT(
                "DPO of a PEFT model without ref_model runs the reference as the same model with its adapters off, "
                "in PyTorch between ORT's forward and backward of that model, which gives wrong reference "
                "log-probabilities (measured: NaN); pass ref_model=<the base model, built like the policy>"
            )
        super().__init__(*positional, **kwargs)


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)
