"""What replaces `DeepSpeedZeRoOffload.setup_zero_stage3_hooks`: ort_zero's subscriber instead of DeepSpeed's hooks."""

from __future__ import annotations

from typing import Any

from deepspeed.runtime.zero import parameter_offload
from deepspeed.utils import z3_leaf_module

from ..hooks import SubscriberManager
from .subscriber import ZeROOffloadSubscriber, hooked_modules


class _Unsubscribe:
    """Stands in for DeepSpeed's hook handles, so `DeepSpeedZeRoOffload.destroy()` removes ort_zero's hooks."""

    def __init__(self, manager: SubscriberManager, subscriber: ZeROOffloadSubscriber) -> None:
        self.manager, self.subscriber = manager, subscriber

    def remove(self) -> None:
        self.manager.unsubscribe()
        self.subscriber.close()


def setup_zero_stage3_hooks(offload: Any) -> None:
    """Number the modules as DeepSpeed does, then subscribe the ZeRO-3 subscriber to the whole model."""
    root = offload.module
    # The model itself: a wrapper like ORTModule lists the module it wraps, not itself, first in modules(). The
    # wrapper only gets the outermost calls (a step's start, in Python around the ORT graph); the model's modules,
    # its root included, are gathered and released where they run (inside the graph under ORTModule).
    model = next(iter(root.modules()))
    coordinator = offload.get_param_coordinator()
    if not coordinator.is_invalid_trace():
        coordinator._invalidate_trace()  # hooks changed: the recorded module order is stale
    offload.hierarchy = 0
    for ds_id, module in enumerate(hooked_modules(model)):
        module.ds_id = ds_id
        module.ds_recompute_parameters = set()
        for param in module.parameters() if z3_leaf_module(module) else ():
            param.ds_z3_leaf_module = module
    manager = SubscriberManager()
    subscriber = ZeROOffloadSubscriber(offload, model)
    manager.subscribe(root, [subscriber])
    handle = _Unsubscribe(manager, subscriber)
    offload.ort_zero_subscriber = subscriber
    offload.fwd_pre_hook = handle
    offload.forward_hooks = [handle]
    offload.backward_hooks = []
    parameter_offload.FWD_MODULE_STACK.append(root)
