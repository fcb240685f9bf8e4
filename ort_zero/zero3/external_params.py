"""Parameters a module reads without calling the module that owns them, found by the forward before an export.

Natively, ZeRO-3 finds them at their first eager access: a partitioned parameter read while another module's forward
runs becomes an external parameter of the innermost running module (DeepSpeed's `ZeROOrderedDict`), gathered with
it from then on (a Mamba mixer's fused convolution reads `conv1d.weight` and never calls `conv1d`). An export never
makes that access (its stand-ins are marked available), so the graph would read a parameter no bridge gathers.
While the export's trace runs (`discovering`), such reads are noted, and when it ends each parameter is registered
with the module that read it, as DeepSpeed would; a trace that found one is traced again, and that module's bridge
gathers it (`ort.ortmodule.graph_transition_manager`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from deepspeed.runtime.zero.partition_parameters import register_external_parameter

from ..foreign import deepspeed as ds_internals
from . import state as zero3_state

logger = logging.getLogger(__name__)


@dataclass
class Discovery:
    """One forward's running modules (innermost last) and the outside reads found so far."""

    running: list[zero3_state.ModuleState] = field(default_factory=list)
    fetched: dict[int, set[int]] = field(default_factory=dict)  # module key -> ids of the parameters it gathers
    found: dict[int, tuple[zero3_state.ModuleState, str, torch.nn.Parameter]] = field(default_factory=dict)

    def gathered_by_a_running_module(self, param: torch.nn.Parameter) -> bool:
        for module_state in self.running:
            if module_state.key not in self.fetched:
                self.fetched[module_state.key] = set(map(id, ds_internals.fetched_params(module_state.module)))
            if id(param) in self.fetched[module_state.key]:
                return True
        return False


_ACTIVE: contextvars.ContextVar[Discovery | None] = contextvars.ContextVar("ort_zero_external_params", default=None)


@contextlib.contextmanager
def discovering() -> Iterator[Discovery]:
    """While it lasts, reads of partitioned parameters outside the running modules are noted; at its end they are
    registered as external parameters of the modules that read them (what it found: `Discovery.found`)."""
    discovery = Discovery()
    token = _ACTIVE.set(discovery)
    try:
        yield discovery
    finally:
        _ACTIVE.reset(token)
    register(discovery)


def entered(module_state: zero3_state.ModuleState) -> None:
    if (discovery := _ACTIVE.get()) is not None:
        discovery.running.append(module_state)


def left(module_state: zero3_state.ModuleState) -> None:
    if (discovery := _ACTIVE.get()) is not None and module_state in discovery.running:
        del discovery.running[len(discovery.running) - 1 - discovery.running[::-1].index(module_state)]


def noted(name: str, param: torch.nn.Parameter | None) -> None:
    """`param` (a module's parameter `name`) was read; an outside read is kept for the innermost running module."""
    discovery = _ACTIVE.get()
    if discovery is None or not discovery.running or param is None or not hasattr(param, "ds_id"):
        return
    if id(param) not in discovery.found and not discovery.gathered_by_a_running_module(param):
        discovery.found[id(param)] = (discovery.running[-1], name, param)


def noting_reads(getitem: Callable[[object, str], object]) -> Callable[[object, str], object]:
    """DeepSpeed's `ZeROOrderedDict.__getitem__` (a ZeRO-3 module's `_parameters[name]`), telling `noted` too."""

    def getitem_noted(parameters: object, name: str) -> object:
        value = getitem(parameters, name)
        if isinstance(value, torch.nn.Parameter):
            noted(name, value)
        return value

    return getitem_noted


def register_read_outside(external: list[tuple[torch.nn.Module, torch.nn.Parameter]]) -> None:
    """Registers each parameter a training graph's backward reads outside its module with the module whose backward
    re-gathers it (the graph's plan: `ort.passes.backward_gather`)."""
    for module, param in external:
        register_external_parameter(module, param)


def register(discovery: Discovery) -> None:
    for module_state, name, param in discovery.found.values():
        register_external_parameter(module_state.module, param)
        module_state.exported_params = None  # the module's bridge gathers it too from the export on
        logger.info(
            "ort_zero: %s reads parameter '%s' (ds_id %d) of a module it does not call: registered as its external "
            "parameter, as DeepSpeed does at the first eager access",
            type(module_state.module).__name__, name, param.ds_id,
        )  # fmt: skip
