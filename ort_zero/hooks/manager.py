"""SubscriberManager: installs subscribers on a module tree, in one place, with removable handles."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from .export_mode import is_exporting
from .nested import flatten
from .subscriber import RunContext, SubscriberBase


class SubscriberManager:
    """Runs subscribers around every module's forward.

    Order at a module's pre-forward: outermost-module calls (root only), then for each subscriber its module-level
    call and its tensor-level calls. Post-forward mirrors it, outermost last. The global step advances after each
    outermost forward, except while exporting.
    """

    def __init__(self) -> None:
        self.run_context = RunContext()
        self.subscribers: list[SubscriberBase] = []
        self._handles: list[RemovableHandle] = []
        self._root: torch.nn.Module | None = None

    def subscribe(self, root: torch.nn.Module, subscribers: list[SubscriberBase]) -> None:
        if self._root is not None:
            raise RuntimeError("this SubscriberManager is already subscribed to a module; unsubscribe() first")
        self._root = root
        self.subscribers = list(subscribers)
        modules = list(root.modules())
        if not any(module is root for module in modules):
            # A wrapper whose modules() lists only what it wraps (ORTModule): its own hooks run in Python around
            # the wrapped graph, which is where the outermost-module calls (a step's start and end) belong.
            modules.insert(0, root)
        for module in modules:
            self._handles.append(module.register_forward_pre_hook(self._pre_forward, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post_forward, with_kwargs=True))

    def unsubscribe(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.subscribers = []
        self._root = None

    def _active(self) -> list[SubscriberBase]:
        return [s for s in self.subscribers if s.is_active(self.run_context)]

    def _pre_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        ctx = self.run_context
        active = self._active()
        if module is self._root:
            for subscriber in active:
                args, kwargs = subscriber.pre_forward_outermost_module(ctx, module, args, kwargs)
        for subscriber in active:
            args, kwargs = subscriber.pre_forward_module(ctx, module, args, kwargs)
            if type(subscriber).pre_forward_tensor is not SubscriberBase.pre_forward_tensor:
                flat = flatten((args, kwargs))
                tensors = [subscriber.pre_forward_tensor(ctx, module, i, t) for i, t in enumerate(flat.tensors)]
                args, kwargs = flat.rebuild(tensors)
        return args, kwargs

    def _post_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], outputs: Any) -> Any:
        ctx = self.run_context
        active = self._active()
        for subscriber in active:
            outputs = subscriber.post_forward_module(ctx, module, args, outputs)
            if type(subscriber).post_forward_tensor is not SubscriberBase.post_forward_tensor:
                flat = flatten(outputs)
                tensors = [subscriber.post_forward_tensor(ctx, module, i, t) for i, t in enumerate(flat.tensors)]
                outputs = flat.rebuild(tensors)
        if module is self._root:
            for subscriber in active:
                outputs = subscriber.post_forward_outermost_module(ctx, module, args, outputs)
            if not is_exporting():
                ctx.global_step += 1
        return outputs
