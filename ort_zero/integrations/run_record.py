"""Record what a DeepSpeed run's optimizer sees, step by step, so that any two runs can be compared.

Two runs of one model and data that differ in ZeRO stage, world size (gradient accumulation making up the global
batch), precision or backend part somewhere; `ort-zero compare` finds where from two such records. Per optimizer step
every rank takes part (the gathers are collectives) and rank 0 writes one line of `steps.jsonl`:
- the loss, averaged over the step's micro-batches and the ranks, and the grad norm DeepSpeed computed;
- each trainable parameter's gradient, whole, as the optimizer is about to use it (before clipping; the ranks' ZeRO
  shares combined, `shared_statistics`);
- each parameter after the step, whole (DeepSpeed's fp32 master weights, likewise);
- every module's outputs in rank 0's first forward of the step (in an ORT run through recorder ops in its graph,
  `graph_outputs`).
Tensors are kept as statistics (`shared_statistics`), in the model's parameter order. `record.json`
says what the run was (parameters and shapes, ZeRO stage, ranks, accumulation, precision, backend).

`record_engine(engine, output_dir)` after `deepspeed.initialize` (or on the engine `accelerator.prepare` returns);
`record_trainer(trainer, output_dir)` before a transformers or TRL Trainer trains. Off, nothing is wrapped: no cost.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..hooks.nested import flatten
from ..hooks.statistics import ROOT_NAME
from ..ort.export.errors import unwrapped
from . import graph_outputs, shared_statistics
from .record_files import RECORD, STEPS


def precision_of(engine: Any) -> str:
    if engine.bfloat16_enabled():
        return "bf16"
    return "fp16" if engine.fp16_enabled() else "fp32"


def backend_of(engine: Any) -> str:
    module = engine.module
    return "ort" if type(module).__name__ == "ORTModule" else "pytorch"


class EngineRecorder:
    """Wraps one engine's `backward` (the loss) and its optimizer's `step` (gradients before, parameters after): this
    object's attributes only, when asked to record (DeepSpeed's classes are not patched); a forward pre-hook notes the
    samples, forward hooks (or, in ORT, recorder ops) the module outputs."""

    def __init__(self, engine: Any, output_dir: Path) -> None:
        self.engine = engine
        self.output_dir = Path(output_dir)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.parameters = [(unwrapped(n), p) for n, p in engine.module.named_parameters() if p.requires_grad]
        self.losses: list[float] = []
        self.activations: dict[str, Any] | None = None  # the step's first forward on this rank, module by module
        self.samples: list[str] = []  # a digest of each sample this rank trained on in the step
        self.unclipped: dict[str, Any] | None = None  # without ZeRO: the gradients before the engine clipped them
        self.step = 0

    def install(self) -> EngineRecorder:
        engine, optimizer = self.engine, self.engine.optimizer
        engine.backward = self._noting_the_loss(engine.backward)
        engine.register_forward_pre_hook(self._note_samples, with_kwargs=True)
        optimizer.step = self._recording_around(optimizer.step)
        engine.clip_fp32_gradients = self._noting_before(engine.clip_fp32_gradients)
        if backend_of(engine) == "ort":
            if not graph_outputs.record_outputs(engine.module, self._keep_output) and self.rank == 0:
                print(graph_outputs.NOT_RECORDED, flush=True)
        elif self.rank == 0:
            for name, module in engine.module.named_modules():
                module.register_forward_hook(self._activation_recorder(unwrapped(name) or ROOT_NAME))
        if self.rank == 0:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / RECORD).write_text(json.dumps(self.describe(), indent=1) + "\n")
            (self.output_dir / STEPS).write_text("")
        return self

    def describe(self) -> dict[str, Any]:
        engine = self.engine
        return {
            "parameters": [[name, list(_full_shape(p))] for name, p in self.parameters],
            "zero_stage": engine.zero_optimization_stage(),
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "train_batch_size": engine.train_batch_size(),
            "precision": precision_of(engine),
            "backend": backend_of(engine),
        }

    def _activation_recorder(self, name: str) -> Callable[..., None]:
        """A forward hook keeping the statistics of a module's output tensors in the step's first forward (the same
        micro-batch in runs of the same ranks and accumulation)."""

        def record(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if torch.is_grad_enabled():  # not an evaluation, nor a recompute in the backward
                for index, tensor in enumerate(flatten(output).tensors):
                    self._keep_output(f"{name}/output_{index}", tensor)

        return record

    def _keep_output(self, name: str, tensor: torch.Tensor) -> None:
        """One module output, kept if it is of rank 0's first forward of the step and not of an evaluation."""
        if self.rank != 0 or not self.engine.module.training:
            return
        if self.activations is None:
            self.activations = {}
        elif self.losses:
            return  # a later micro-batch of the step, or a recompute in its backward
        if tensor.is_floating_point():
            self.activations[name] = shared_statistics.whole(tensor)

    def _note_samples(self, engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A forward pre-hook on the engine: a digest of each sample of the micro-batch (not in an evaluation)."""
        tokens = _model_input(args, kwargs)
        if tokens is not None and torch.is_grad_enabled():
            rows = tokens.detach().cpu().reshape(tokens.shape[0], -1)
            self.samples += [hashlib.blake2b(row.numpy().tobytes(), digest_size=6).hexdigest() for row in rows]

    def _noting_the_loss(self, backward: Callable[..., Any]) -> Callable[..., Any]:
        def noted(loss: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.losses.append(float(loss.detach().float().item()))
            return backward(loss, *args, **kwargs)

        return noted

    def _noting_before(self, clip: Callable[..., Any]) -> Callable[..., Any]:
        """Without ZeRO the engine clips fp32 gradients before its optimizer's step (a ZeRO optimizer in its step)."""

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.unclipped = self._combined(shared_statistics.gradient_share)
            return clip(*args, **kwargs)

        return noted

    def _recording_around(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            grads = self.unclipped or self._combined(shared_statistics.gradient_share)
            self.unclipped = None
            result = step(*args, **kwargs)
            self._write(grads, self._combined(shared_statistics.parameter_share))
            return result

        return recorded

    def _combined(self, share_of: Callable[[torch.Tensor], torch.Tensor | None]) -> dict[str, Any]:
        statistics = shared_statistics.combined([share_of(param) for _, param in self.parameters])
        return {name: stats for (name, _), stats in zip(self.parameters, statistics, strict=True)}

    def _write(self, grads: dict[str, Any], params: dict[str, Any]) -> None:
        loss = torch.tensor([sum(self.losses), len(self.losses)], dtype=torch.float64)
        samples = [self.samples]
        if dist.is_initialized():
            dist.all_reduce(loss)
            samples = [[] for _ in range(dist.get_world_size())]
            dist.all_gather_object(samples, self.samples)
        self.losses, self.samples = [], []
        if self.rank == 0:
            norm = getattr(self.engine.optimizer, "_global_grad_norm", None) or _norm_of(grads)
            line = {
                "step": self.step,
                "loss": loss[0].item() / max(loss[1].item(), 1.0),
                "grad_norm": None if norm is None else float(norm),
                "samples": sorted(digest for rank in samples for digest in rank),
                "activations": self.activations,
                "grads": grads,
                "params": params,
            }
            with (self.output_dir / STEPS).open("a") as steps:
                steps.write(json.dumps(line) + "\n")
        self.activations = None
        self.step += 1


def _norm_of(grads: dict[str, Any]) -> float:
    """The gradients' global norm from their statistics, where the optimizer keeps none (no ZeRO)."""
    squares = sum(g["numel"] * (g["std"] ** 2 + g["mean"] ** 2) for g in grads.values() if g is not None)
    return math.sqrt(squares)


def _model_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The tensor a forward's samples are told apart by: `input_ids`, else its first tensor argument."""
    if isinstance(kwargs.get("input_ids"), torch.Tensor):
        return kwargs["input_ids"]
    return next((a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor) and a.dim() > 0), None)


def _full_shape(param: torch.Tensor) -> tuple[int, ...]:
    return tuple(getattr(param, "ds_shape", None) or param.shape)


def record_engine(engine: Any, output_dir: str | Path) -> EngineRecorder:
    """Record `engine`'s steps into `output_dir` (call on every rank, after `deepspeed.initialize`)."""
    return EngineRecorder(engine, Path(output_dir)).install()


def record_trainer(trainer: Any, output_dir: str | Path) -> None:
    """Record a transformers (or TRL) Trainer's DeepSpeed steps into `output_dir`: call before `trainer.train()`, on
    every rank. The engine exists only once training begins, so a callback attaches the recorder then."""
    from transformers import TrainerCallback

    class AttachRecorder(TrainerCallback):
        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            engine = trainer.model_wrapped
            if not hasattr(engine, "zero_optimization_stage"):
                raise ValueError(
                    f"record_trainer records DeepSpeed runs; this Trainer trains a {type(engine).__name__}: "
                    "give it a DeepSpeed config (TrainingArguments(deepspeed=...))"
                )
            record_engine(engine, output_dir)

    trainer.add_callback(AttachRecorder())
