"""What replaces `DeepSpeedZeRoOffload.setup_zero_stage3_hooks`: ort_zero's subscriber instead of DeepSpeed's hooks."""

from __future__ import annotations

from typing import Any

from deepspeed.utils import z3_leaf_module

from ..foreign import deepspeed as ds_internals
from ..hooks import SubscriberManager
from ..restarts import forget_group_addresses
from .subscriber import ZeROOffloadSubscriber, hooked_modules


class _Unsubscribe:
    """Stands in for DeepSpeed's hook handles, so `DeepSpeedZeRoOffload.destroy()` removes ort_zero's hooks."""

    def __init__(self, manager: SubscriberManager, subscriber: ZeROOffloadSubscriber) -> None:
        self.manager, self.subscriber = manager, subscriber

    def remove(self) -> None:
        self.manager.unsubscribe()
        self.subscriber.close()


def setup_zero_stage3_hooks(offload: Any) -> None:
    """Number the modules as DeepSpeed does, then subscribe the ZeRO-3 subscriber to the whole model. The engine has
    formed its groups by now: under torchrun their addresses leave the agent's store (ort_zero/restarts.py)."""
    root = offload.module
    # The model itself: a wrapper like ORTModule lists the module it wraps, not itself, first in modules(). The
    # wrapper only gets the outermost calls (a step's start, in Python around the ORT graph); the model's modules,
    # its root included, are gathered and released where they run (inside the graph under ORTModule).
    model = next(iter(root.modules()))
    ds_internals.invalidate_trace(offload)  # hooks changed: the recorded module order is stale
    for ds_id, module in enumerate(hooked_modules(model)):
        module.ds_id = ds_id
        module.ds_recompute_parameters = set()
        for param in module.parameters() if z3_leaf_module(module) else ():
            param.ds_z3_leaf_module = module
    manager = SubscriberManager()
    subscriber = ZeROOffloadSubscriber(offload, model)
    manager.subscribe(root, [subscriber])
    handle = _Unsubscribe(manager, subscriber)
    ds_internals.take_over_hooks(offload, handle, subscriber)
    ds_internals.forward_module_stack().append(root)
    forget_group_addresses()
