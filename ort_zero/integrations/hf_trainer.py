"""Hugging Face's `Trainer` in ONNX Runtime under DeepSpeed ZeRO-3: `ORTZeroTrainer`, a drop-in replacement.

    from ort_zero.integrations.hf_trainer import ORTZeroTrainer as Trainer  # the one changed line

with `TrainingArguments(deepspeed="ds_configs/zero3_hf_auto.json", ...)` (or `--deepspeed`), under any launcher, or
under `accelerate launch` with its DeepSpeed plugin at ZeRO stage 3 (no `deepspeed` argument).

The Trainer keeps the user's model as `trainer.model`: it reads its forward signature (label names, dataset columns,
loss kwargs), saves it with `save_pretrained` and hands it to accelerate's `prepare`, which calls
`deepspeed.initialize`. Only what `prepare` receives is wrapped in ORTModule (whose forward is `(*inputs, **kwargs)`
and tells the Trainer nothing), so DeepSpeed's engine runs the model in ONNX Runtime while everything the Trainer
reads and saves is the plain model's. What the Trainer offers that cannot run in ORT is refused when the trainer is
created, with the reason and the way out. Activation (gradient) checkpointing becomes ort_zero's layer-wise recompute.
"""

from __future__ import annotations

import copy
import inspect
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .. import api, disk_space, patch_groups, patches, settings
from ..foreign import accelerate as accelerate_internals
from ..foreign import transformers as transformers_internals
from ..restarts import forget_group_addresses
from ..zero3 import activation_checkpointing
from . import checkpoints, model_types, preemption


class UnsupportedInORT(ValueError):
    """A Trainer setting that cannot run in ONNX Runtime under ZeRO-3; the message says why and what to do."""


def check_arguments(args: TrainingArguments | None, model: torch.nn.Module | None) -> None:
    """Refuse, before anything starts, what ORTZeroTrainer cannot run; one line per problem, with the way out."""
    if model is not None and hasattr(model, "_torch_module"):
        raise UnsupportedInORT(
            "the model is already an ORTModule; pass the plain model: ORTZeroTrainer wraps it when DeepSpeed starts "
            "(the Trainer must see the model's own forward signature)"
        )
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    reason = model_types.unsupported_reason(model_type)
    if reason is not None:
        raise UnsupportedInORT(
            f"model type '{model_type}' does not train in ONNX Runtime on this stack: {reason}; train it with "
            "transformers.Trainer (native DeepSpeed ZeRO-3), see ort_zero's docs/model-families.md"
        )
    if args is None or (args.deepspeed is None and args.deepspeed_plugin is None):
        raise UnsupportedInORT(
            "ORTZeroTrainer trains with DeepSpeed ZeRO-3: pass TrainingArguments(deepspeed=<a ZeRO-3 config>), "
            "e.g. ds_configs/zero3_hf_auto.json (or --deepspeed on the command line), or launch with accelerate's "
            "DeepSpeed plugin at ZeRO stage 3 (accelerate launch --use_deepspeed --zero_stage 3)"
        )
    if args.torch_compile:
        raise UnsupportedInORT(
            "torch_compile=True and ONNX Runtime both compile the model; set torch_compile=False (ORT runs the graph)"
        )
    if args.label_smoothing_factor:
        raise UnsupportedInORT(
            "label_smoothing_factor is not supported by ORTZeroTrainer: the Trainer smooths labels outside the model "
            "and cannot see through ORTModule that the model is causal (it would not shift the labels); "
            "set label_smoothing_factor=0, or train with transformers.Trainer in PyTorch"
        )
    deepspeed_config = args.hf_deepspeed_config if args.deepspeed else args.deepspeed_plugin.hf_ds_config
    if not deepspeed_config.is_zero3():
        stage = deepspeed_config.get_value("zero_optimization.stage", 0)
        source = f"the DeepSpeed config {args.deepspeed!r}" if args.deepspeed else "accelerate's DeepSpeed plugin"
        raise UnsupportedInORT(
            f"ORTZeroTrainer needs ZeRO stage 3, {source} asks for stage {stage}; use a stage-3 config "
            "(ds_configs/zero3_hf_auto.json, or accelerate's --zero_stage 3), or transformers.Trainer for other stages"
        )
    ranks = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if args.world_size != ranks:
        raise UnsupportedInORT(
            f"the Trainer sees {args.world_size} process(es) of the {ranks} ranks (every rank would train on the same "
            "batches and save as rank 0): accelerate counts DeepSpeed's ranks on CPU only with "
            "TrainingArguments(use_cpu=True)"
        )


def recompute_instead_of_checkpointing(args: TrainingArguments, model: torch.nn.Module | None) -> TrainingArguments:
    """Activation checkpointing (`activation_checkpointing=True` or its deprecated alias `gradient_checkpointing`, or
    enabled on the model) becomes ort_zero's layer-wise recompute in ORT (level 1, or the level already set if
    higher), announced: each decoder layer is recomputed in the backward inside ORT's graph, its parameters gathered
    again. The Trainer gets a copy of `args` that leaves Hugging Face's checkpoint calls off (the caller's `args` is
    not changed); a model that already has them on keeps them, and the export runs them as plain calls."""
    if not (args.activation_checkpointing or getattr(model, "is_activation_checkpointing", False)):
        return args
    settings.recompute_level_override = max(settings.recompute_level(), 1)
    activation_checkpointing.announce(settings.recompute_level_override)
    if not args.activation_checkpointing:
        return args
    args = copy.copy(args)
    args.activation_checkpointing = args.gradient_checkpointing = False  # the old name mirrors the new one
    return args


class ORTZeroTrainer(Trainer):
    """`transformers.Trainer` whose DeepSpeed ZeRO-3 engine runs the model in ONNX Runtime (through ort_zero).

    Training and evaluation run in ORT; `trainer.model` stays the plain model (signature inspection, saving,
    PEFT checks); `save_model()` writes what `from_pretrained` loads without ORT or DeepSpeed. With
    `enable_jit_checkpoint=True`, SIGTERM makes every rank save the same step and stop (integrations/preemption.py).
    """

    def __init__(self, *positional: Any, **kwargs: Any) -> None:
        # Bound to the next class's signature: in `class ORTSFTTrainer(ORTZeroTrainer, DPOTrainer)` that is TRL's,
        # whose arguments come in another order than the Trainer's (DPOTrainer's second is `ref_model`).
        bound = inspect.signature(super().__init__).bind_partial(*positional, **kwargs)
        model, args = bound.arguments.get("model"), bound.arguments.get("args")
        check_arguments(args, model)
        api.enable_zero3()  # before deepspeed.initialize and ORTModule; disables ORTModule's silent fallback
        forget_group_addresses()  # a group the script started: a restarted torchrun attempt must not read them
        if "trl" in sys.modules:  # a TRL trainer (integrations/trl.py)
            patches.apply_group(patch_groups.TRL)
        bound.arguments["args"] = recompute_instead_of_checkpointing(args, model)
        super().__init__(*bound.args, **bound.kwargs)
        checkpoints.check_space_before_saves(self)  # every rank stops before a save the disk has no room for
        if self.args.enable_jit_checkpoint:  # every rank saves the same, consistent step (integrations/preemption.py)
            preemption.stop_on_sigterm(self)

    def create_accelerator_and_postprocess(self) -> None:
        """The Trainer's own accelerator, whose `prepare` gets the ORTModule in place of `trainer.model`."""
        super().create_accelerator_and_postprocess()
        accelerate_internals.prepare_through(self.accelerator, lambda o: self._in_ort(o) if o is self.model else o)

    @staticmethod
    def _in_ort(model: torch.nn.Module) -> torch.nn.Module:
        return in_ort(model)

    def train(self, resume_from_checkpoint: str | bool | None = None, *more: Any, **kwargs: Any) -> Any:
        """`resume_from_checkpoint=True` resumes from the newest checkpoint every rank finished and whose files all
        read, not the newest folder (one cut short by a lost rank, or with a truncated or corrupt file, is skipped,
        with a warning); without one, the Trainer's own error. A chosen folder with such a file raises
        `checkpoints.DamagedCheckpoint`, naming it, before anything loads."""
        if resume_from_checkpoint is True:
            complete = checkpoints.last_complete_checkpoint(self.args.output_dir)
            resume_from_checkpoint = str(complete) if complete else True
        elif resume_from_checkpoint:
            checkpoints.require_readable(Path(resume_from_checkpoint))
        return super().train(resume_from_checkpoint, *more, **kwargs)

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """The Trainer's save; a disk that fills meanwhile ends it in one line naming the directory
        (`disk_space.DiskFilledDuringSave`), not torch's `iostream error`."""
        step = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        with disk_space.saving_into(Path(transformers_internals.checkpoint_root(self, trial)), step):
            transformers_internals.save_checkpoint(ORTZeroTrainer, self, model, trial)

    def _save_rng_state(self, output_dir: str) -> None:
        """The Trainer's last per-rank write of a checkpoint; rank 0 writes the Trainer state (the folder's last
        file) only after every rank has finished: a checkpoint with it is complete (integrations/checkpoints.py)."""
        transformers_internals.save_rng_state(ORTZeroTrainer, self, output_dir)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Once DeepSpeed's engine exists (after training), the Trainer evaluates `trainer.model`, which would run
        in PyTorch; the engine (so ORT) runs it instead, in the mode the Trainer set on the model."""
        if model is self.model and self.model_wrapped is not self.model:
            self.model_wrapped.train(model.training)
            model = self.model_wrapped
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)


def in_ort(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in an ORTModule (what ORT says about a PreTrainedModel's attributes is cut by `ort.quiet_wrapping`)."""
    from onnxruntime.training.ortmodule import ORTModule

    return ORTModule(model)
