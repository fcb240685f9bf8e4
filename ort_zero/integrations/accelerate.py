"""An accelerate training loop in ONNX Runtime under DeepSpeed ZeRO-3: `ORTZeroAccelerator`, a drop-in `Accelerator`.

    from ort_zero.integrations.accelerate import ORTZeroAccelerator as Accelerator  # the one changed line

    accelerator = Accelerator()  # under `accelerate launch` with its DeepSpeed plugin at ZeRO stage 3
    model = AutoModelForCausalLM.from_config(config)  # after the Accelerator: built under zero.Init
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ...  # loss = model(**batch).loss; accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()

It enables ort_zero before DeepSpeed starts, and `prepare` hands DeepSpeed the model wrapped in ORTModule (what ORT
advises: ORTModule inside DeepSpeed's engine). On DeepSpeed's CPU accelerator it also starts what the loop needs there
before accelerate does, natively as well: DeepSpeed's process group on gloo (without it `zero.Init` counts one rank)
and accelerate's CPU state (without it accelerate counts one process under DeepSpeed): what
`TrainingArguments(use_cpu=True)` does for the Trainer.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator, PartialState

from .. import api
from ..foreign import onnxruntime as ort_internals
from .hf_trainer import UnsupportedInORT, in_ort


class ORTZeroAccelerator(Accelerator):
    """`accelerate.Accelerator` whose DeepSpeed ZeRO-3 engine runs the model in ONNX Runtime (through ort_zero)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from deepspeed.accelerator import get_accelerator

        api.enable_zero3()  # before deepspeed.initialize and ORTModule; disables ORTModule's silent fallback
        if get_accelerator().device_name() == "cpu":
            from ..distributed import init_distributed

            init_distributed()
            PartialState(cpu=True)
        super().__init__(*args, **kwargs)
        plugin = self.state.deepspeed_plugin
        if plugin is None or not plugin.hf_ds_config.is_zero3():
            stage = "no DeepSpeed plugin" if plugin is None else f"ZeRO stage {plugin.zero_stage}"
            raise UnsupportedInORT(
                f"ORTZeroAccelerator trains with DeepSpeed ZeRO-3, accelerate runs {stage}: launch with "
                "`accelerate launch --use_deepspeed --zero_stage 3` or a config file with deepspeed_config.zero_stage "
                "3 (ds_configs/accelerate_zero3_cpu.yaml), or use accelerate.Accelerator"
            )

    def prepare(self, *objects: Any, **kwargs: Any) -> Any:
        """accelerate's `prepare`, with every model (a module not yet in ORTModule) wrapped in ORTModule first."""
        return super().prepare(*(self._in_ort(o) for o in objects), **kwargs)

    @staticmethod
    def _in_ort(candidate: Any) -> Any:
        if not isinstance(candidate, torch.nn.Module) or ort_internals.is_ort_module(candidate):
            return candidate
        return in_ort(candidate)
