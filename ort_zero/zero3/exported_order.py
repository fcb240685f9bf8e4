"""The first step's prefetch, from the order in which the export traced a model's modules.

DeepSpeed's parameter coordinator prefetches only once it has recorded a whole step's module order: through the
first step it gathers each module's parameters when the module is reached and waits for them. A model ORT runs was
traced for its export before its first run, so the forward order of its modules is known by then. While the
coordinator records, each gather for a module's forward also starts the gathers of the parameters of the modules
after it in that order, and each gather for a backward those before it, as much as DeepSpeed would prefetch at once
(its prefetch bucket, within its live-parameter limit), as its own prefetch does from the second step on. A wrong
guess costs the early gather and what it holds until its module comes: DeepSpeed's fetch then waits for whatever of
that module's parameters is in flight, as it does for its own prefetches. Every rank decides alike (the order and the
parameters' states are the same on each), so the gathers' collectives match.

Measured (bf16 LLaMA 162M, seq 1024, 2 CPU ranks, rank 0, 2026-12-02): the first step's gathers for the forward took
1.20 s and for the backward 1.10 s (later steps: 0.25-0.35 and 0.06-0.07); with this prefetch 0.82 and 0.42.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from ..foreign import deepspeed as ds_internals


@dataclass(eq=False)
class ExportedOrder:
    """The hooked modules of one model in the order its latest export traced their forwards."""

    modules: list[torch.nn.Module] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)  # by id(module)

    def restart(self) -> None:
        """An export's trace begins: the order is the one it traces."""
        self.modules.clear()
        self.positions.clear()

    def traced(self, module: torch.nn.Module) -> None:
        """The trace reached `module`'s forward (its first call counts)."""
        if id(module) not in self.positions:
            self.positions[id(module)] = len(self.modules)
            self.modules.append(module)

    def prefetch_from(self, module: torch.nn.Module, offload: object, forward: bool) -> None:
        """After `module`'s gather: while the coordinator records its trace, start gathering what comes next (for a
        forward, the modules after it; for a backward, those before it)."""
        position = self.positions.get(id(module))
        if position is None or not ds_internals.records_trace(offload):
            return
        budget = ds_internals.prefetch_budget(offload)
        later = self.modules[position + 1 :] if forward else reversed(self.modules[:position])
        chosen: dict[int, torch.nn.Parameter] = {}
        numel = 0
        for upcoming in later:
            if numel >= budget:
                break
            for param in ds_internals.fetched_params(upcoming):
                if param.ds_status == ZeroParamStatus.NOT_AVAILABLE and id(param) not in chosen:
                    chosen[id(param)] = param
                    numel += param.ds_numel
        if chosen:
            ds_internals.start_gathers(offload, list(chosen.values()), forward)
