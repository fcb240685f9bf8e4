"""SubscriberBase: what a subscriber may do at each point of a module's forward.

A subscriber sees every module of a subscribed tree. Module-level methods get the whole inputs/outputs (and may
replace them); tensor-level methods get each tensor of them in flattened order. The outermost module's inputs and
outputs get one more call each, once per forward, before/after the per-module calls. A subscriber can limit itself
to a window of global steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class RunContext:
    """State shared by all subscribers of one manager: the global step counts completed (non-export) forwards."""

    global_step: int = 0


class SubscriberBase:
    """Override the methods you need; every default passes its input through unchanged."""

    def __init__(self, start_step: int | None = None, end_step: int | None = None) -> None:
        self.start_step = start_step
        self.end_step = end_step

    def is_active(self, run_context: RunContext) -> bool:
        step = run_context.global_step
        return (self.start_step is None or step >= self.start_step) and (self.end_step is None or step < self.end_step)

    def pre_forward_outermost_module(
        self, run_context: RunContext, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[tuple, dict[str, Any]]:
        return args, kwargs

    def pre_forward_module(
        self, run_context: RunContext, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[tuple, dict[str, Any]]:
        return args, kwargs

    def pre_forward_tensor(
        self, run_context: RunContext, module: torch.nn.Module, index: int, tensor: torch.Tensor
    ) -> torch.Tensor:
        return tensor

    def post_forward_module(self, run_context: RunContext, module: torch.nn.Module, args: tuple, outputs: Any) -> Any:
        return outputs

    def post_forward_tensor(
        self, run_context: RunContext, module: torch.nn.Module, index: int, tensor: torch.Tensor
    ) -> torch.Tensor:
        return tensor

    def post_forward_outermost_module(
        self, run_context: RunContext, module: torch.nn.Module, args: tuple, outputs: Any
    ) -> Any:
        return outputs
