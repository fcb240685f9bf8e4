"""TRL's trainers in ORT (ort_zero/integrations/trl.py): applied when an ORTZeroTrainer is created with TRL imported."""

from __future__ import annotations

from ..declaration import Declaration
from ..foreign.versions import TRL_VERSIONS
from ..patch_groups import TRL
from ..patching import Patch, register
from .declare import deferred, ort_zero_module

register(
    Patch(
        Declaration(
            "trl.lm_head_gather_of_parameters_only", "trl.trainer.utils.maybe_gather_lm_head_ctx",
            "TRL's ChunkedLogProbFunction gathers the LM head's ZeRO-3 parameters again in its backward; run by ORT as "
            "a PythonOp it receives the full tensors ort_zero's bridges gathered (plain tensors, no ds_status): only "
            "ZeRO-3 parameters are gathered, the rest are full already",
            deferred(lambda: ort_zero_module("zero3.foreign_gathers").gathering_parameters_only),
        ),
        "trl",  # the distribution
        TRL_VERSIONS,
    ),
    TRL,
)  # fmt: skip
