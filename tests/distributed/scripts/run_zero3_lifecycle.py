"""ZeRO-3 parameter lifecycles on this rank, natively or through ort_zero: what DeepSpeed's own tests check.

Scenarios (each a fresh engine): a module that returns its own parameter through two module boundaries; non-reentrant
activation checkpointing over three clean steps; an exception in a checkpoint's recompute forward, then a retry; a
backward cut short by an exception, then a retry. Each records the DeepSpeed state a user could observe (parameter
status, external and recompute parameters, active consumers, the per-module gradient counts) at the boundaries where
DeepSpeed defines it. Writes `<out>/rank<r>.json`: {scenario: record}.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.nn.functional as F
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from rank_run import finish, start, write_result
from torch import nn
from torch.utils.checkpoint import checkpoint

WIDTH = 8
CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
    "zero_optimization": {
        "stage": 3,
        # every parameter partitioned, no prefetch, no reuse window: statuses reflect the current consumer only
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_reuse_distance": 0,
    },
    "zero_force_ds_cpu_optimizer": False,
    "steps_per_print": 10**9,
}


class BiasReturningLinear(nn.Linear):
    """Returns its own (partitioned) bias: DeepSpeed makes it an external parameter of the enclosing module."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.linear(x, self.weight, self.bias), self.bias


class PassesBiasOn(nn.Module):
    """Hands the inner module's bias on through a second module boundary; notes what it received."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.inner = BiasReturningLinear(WIDTH, WIDTH)
        self.seen: list[dict[str, Any]] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, bias = self.inner(self.proj(x))
        if not torch.jit.is_tracing():  # under ORT this Python runs only while exporting
            param = bias if hasattr(bias, "ds_id") else getattr(bias, "ds_param_alias", None)
            self.seen.append({
                "param": param is self.inner.bias,
                "status": param.ds_status.name if param is not None else None,
            })  # fmt: skip
        return out, bias


class ReturnedParamModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.passes = PassesBiasOn()
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.passes(self.stem(x))
        return self.head(torch.tanh(out + bias)).sum()


class CheckpointedModel(nn.Module):
    """A frozen and a trainable layer inside a non-reentrant checkpoint; `fail` injects the two exceptions."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(WIDTH, WIDTH)
        self.frozen.requires_grad_(False)
        self.trainable = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 1)
        self.fail = {"recompute": False, "backward": False}

    def checkpointed(self, x: torch.Tensor) -> torch.Tensor:
        x = self.frozen(x)
        if self.fail["recompute"] and torch._C._current_graph_task_id() != -1:
            self.fail["recompute"] = False
            raise RuntimeError("injected: recompute forward")
        return RaiseOnceInBackward.apply(self.trainable(torch.tanh(x)), self.fail)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.checkpointed, x, use_reentrant=False)).sum()


class RaiseOnceInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fail: dict[str, bool]) -> torch.Tensor:
        ctx.fail = fail
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.fail["backward"]:
            ctx.fail["backward"] = False
            raise RuntimeError("injected: backward")
        return grad, None


def zero3_state(model: nn.Module) -> dict[str, Any]:
    """What DeepSpeed's lifecycle checks look at, by module and parameter name in `model` (wrapped or not). Not
    DeepSpeed's per-module gradient counts: ort_zero keeps each call's phase instead (`zero3.state.ModuleCall`)."""
    modules = dict(model.named_modules())
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        "recompute": {name or "<root>": sorted(names[id(p)] for p in m.ds_recompute_parameters)
                      for name, m in modules.items() if m.ds_recompute_parameters},
        "external": {name or "<root>": sorted(names[k] for k in m._external_params)
                     for name, m in modules.items() if getattr(m, "_external_params", None)},
        "gathered": sorted(n for n, p in model.named_parameters() if p.ds_status != ZeroParamStatus.NOT_AVAILABLE),
        "active": sorted(n for n, p in model.named_parameters() if p.ds_active_sub_modules),
        "is_external": sorted(n for n, p in model.named_parameters() if p.is_external_param),
    }  # fmt: skip


def sample(step: int, rank: int) -> torch.Tensor:
    return torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(100 * step + rank), requires_grad=True)


def returned_param(engine: deepspeed.DeepSpeedEngine, model: ReturnedParamModel, rank: int) -> dict[str, Any]:
    losses, states = [], []
    for step in range(3):
        loss = engine(sample(step, rank))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        states.append(zero3_state(model))
    named = list(model.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in named]):
        params = {name: p.detach().double().flatten().tolist() for name, p in named}
    return {"losses": losses, "states": states, "seen": model.passes.seen, "params": params}


def checkpoint_steps(engine: deepspeed.DeepSpeedEngine, model: CheckpointedModel, rank: int) -> dict[str, Any]:
    """Three clean steps; the probe sees the state once the checkpointed region's backward has run."""
    after_region = []
    for step in range(3):
        x = sample(step, rank)
        probe = StateProbe.apply(x, lambda: after_region.append(zero3_state(model)))
        engine.backward(engine(probe))
        engine.step()
    return {"after_region": after_region, "after_step": zero3_state(model)}


class StateProbe(torch.autograd.Function):
    """Identity whose backward (after everything downstream of it) calls `observe`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, observe: Callable[[], None]) -> torch.Tensor:
        ctx.observe = observe
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.observe()
        return grad, None


def failed_then_retried(kind: str) -> Callable[[deepspeed.DeepSpeedEngine, CheckpointedModel, int], dict[str, Any]]:
    """engine.backward fails once (in the recompute forward, or in the backward itself); a retry uses
    loss.backward(). The state at the retry's start (after DeepSpeed's step start) and after the retry."""

    def run(engine: deepspeed.DeepSpeedEngine, model: CheckpointedModel, rank: int) -> dict[str, Any]:
        model.fail[kind] = True
        try:
            engine.backward(engine(sample(0, rank)))
        except RuntimeError as error:
            failure = str(error)
        else:
            failure = None
        at_retry_start = []
        handle = model.register_forward_pre_hook(  # after DeepSpeed's (or ort_zero's) step start
            lambda module, args: at_retry_start.append(zero3_state(model)) if not at_retry_start else None
        )
        engine(sample(1, rank)).backward()
        handle.remove()
        return {"failure": failure, "at_retry_start": at_retry_start, "after_retry": zero3_state(model)}

    return run


SCENARIOS: dict[str, tuple[type[nn.Module], Callable[..., dict[str, Any]]]] = {
    "returned_param": (ReturnedParamModel, returned_param),
    "checkpoint_steps": (CheckpointedModel, checkpoint_steps),
    "recompute_exception": (CheckpointedModel, failed_then_retried("recompute")),
    "incomplete_backward": (CheckpointedModel, failed_then_retried("backward")),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "torch", "ort"], required=True)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank = start(args.mode)
    results = {}
    for scenario in args.scenario:
        make_model, run = SCENARIOS[scenario]
        torch.manual_seed(0)
        model = make_model()
        wrapped = model
        if args.mode == "ort":
            from onnxruntime.training.ortmodule import ORTModule

            wrapped = ORTModule(model)
        engine, *_ = deepspeed.initialize(
            model=wrapped, model_parameters=[p for p in wrapped.parameters() if p.requires_grad], config=CONFIG
        )
        try:
            results[scenario] = run(engine, model, rank)
        except Exception as error:  # the record says what broke; the remaining scenarios still run
            results[scenario] = {"error": f"{type(error).__name__}: {error}"}
        results[scenario]["ort_zero_hooks"] = hasattr(engine.optimizer.parameter_offload, "ort_zero_subscriber")
        if args.mode == "ort":
            from ort_zero.ort.inspection import ort_run_record

            results[scenario]["ort"] = ort_run_record(engine.module)["training"]
        engine.destroy()
    write_result(args.out, rank, results)
    finish()


if __name__ == "__main__":
    os.environ.setdefault("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    main()
