"""A fake DeepSpeedZeRoOffload that records what ort_zero's ZeRO-3 hooks ask of it, and the fixtures around it.

No DeepSpeed engine and no process group: the fake only keeps the contract ort_zero relies on
(`pre_sub_module_forward_function` pushes the module on `parameter_offload.FWD_MODULE_STACK`, the post-forward
path pops it, `get_param_coordinator().reset_step()` starts a step, `is_record_trace()` says whether it records).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from deepspeed.runtime.zero import parameter_offload

from ort_zero.hooks import SubscriberManager
from ort_zero.zero3.subscriber import ZeROOffloadSubscriber

# (call, module name): call is one of "reset_step" (module name ""), "fwd_gather", "fwd_release", "bwd_gather",
# "bwd_release", after the DeepSpeedZeRoOffload method that was called.
Event = tuple[str, str]
GATHER, RELEASE, BWD_GATHER, BWD_RELEASE, RESET = "fwd_gather", "fwd_release", "bwd_gather", "bwd_release", "reset_step"


class FakeCoordinator:
    """Stands in for DeepSpeed's PartitionedParameterCoordinator: logs `reset_step`, has a trace to invalidate, never
    records one."""

    def __init__(self, log: list[Event]) -> None:
        self.log = log
        self.trace_invalid = False

    def reset_step(self) -> None:
        self.log.append((RESET, ""))

    def is_invalid_trace(self) -> bool:
        return self.trace_invalid

    def is_record_trace(self) -> bool:
        """Never recording: the first step's prefetch (`exported_order`) gathers nothing through the fake."""
        return False

    def _invalidate_trace(self) -> None:
        self.trace_invalid = True


class FakeOffload:
    """Records every ZeRO-3 call as (call, module name); pushes on FWD_MODULE_STACK like DeepSpeed's pre-forward."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.names = {m: name or "root" for name, m in module.named_modules()}
        self.log: list[Event] = []
        self.coordinator = FakeCoordinator(self.log)
        self.stack_at_release: list[list[torch.nn.Module]] = []

    def get_param_coordinator(self) -> FakeCoordinator:
        return self.coordinator

    def pre_sub_module_forward_function(self, module: torch.nn.Module) -> None:
        parameter_offload.FWD_MODULE_STACK.append(module)
        self.log.append((GATHER, self.names[module]))

    def post_sub_module_forward_function(self, module: torch.nn.Module) -> None:
        self.stack_at_release.append(list(parameter_offload.FWD_MODULE_STACK))
        self.log.append((RELEASE, self.names[module]))

    def pre_sub_module_backward_function(self, module: torch.nn.Module) -> None:
        self.log.append((BWD_GATHER, self.names[module]))

    def post_sub_module_backward_function(self, module: torch.nn.Module) -> None:
        self.log.append((BWD_RELEASE, self.names[module]))

    def take(self) -> list[Event]:
        """The calls logged so far; the log starts empty again."""
        events = list(self.log)
        self.log.clear()
        return events


class Subscribed:
    """A model subscribed the way `install.setup_zero_stage3_hooks` does it: one manager, one subscriber."""

    def __init__(self, root: torch.nn.Module) -> None:
        self.root = root
        self.offload = FakeOffload(root)
        self.manager = SubscriberManager()
        self.subscriber = ZeROOffloadSubscriber(self.offload, root)
        self.manager.subscribe(root, [self.subscriber])

    def close(self) -> None:
        self.manager.unsubscribe()
        self.subscriber.close()


@pytest.fixture(autouse=True)
def module_stack(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A fresh DeepSpeed forward-module stack per test, holding the root marker that setup_zero_stage3_hooks adds."""
    stack: list[Any] = ["<root marker>"]
    monkeypatch.setattr(parameter_offload, "FWD_MODULE_STACK", stack)
    return stack


@pytest.fixture
def subscribe() -> Iterator[Any]:
    """`subscribe(model)` -> Subscribed; everything subscribed is unsubscribed and its states dropped afterwards."""
    made: list[Subscribed] = []

    def make(root: torch.nn.Module) -> Subscribed:
        made.append(Subscribed(root))
        return made[-1]

    yield make
    for subscribed in made:
        subscribed.close()


@pytest.fixture
def deepspeed_init() -> Any:
    """`deepspeed_init(model)` leaves what `deepspeed.zero.Init` leaves and export mode reads: parameter ds_ids
    and external-parameter tables."""
    from deepspeed.runtime.zero.partition_parameters import _init_external_params

    def init(root: torch.nn.Module) -> None:
        for ds_id, param in enumerate(root.parameters()):
            param.ds_id = ds_id
            param.ds_shape = param.shape
        for module in root.modules():
            _init_external_params(module)

    return init
