"""ort_zero.hooks.SubscriberManager: call order, kwargs, outermost calls, global step, step window, unsubscribe."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from ort_zero.hooks import RunContext, SubscriberBase, SubscriberManager, exporting, is_exporting


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0, mask: torch.Tensor | None = None) -> dict[str, Any]:
        y = self.linear(x) * scale
        if mask is not None:
            y = y * mask
        return {"y": y, "aux": (x, None)}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.block(x, scale=2.0, mask=mask)["y"])


class Recorder(SubscriberBase):
    """Logs (tag, event, module name, detail) for every call it gets, passing everything through."""

    def __init__(self, log: list[tuple], names: dict[nn.Module, str], tag: str = "r", **window: int) -> None:
        super().__init__(**window)
        self.log, self.names, self.tag = log, names, tag

    def record(self, event: str, module: nn.Module, detail: Any = None) -> None:
        self.log.append((self.tag, event, self.names[module], detail))

    def pre_forward_outermost_module(self, ctx: RunContext, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        self.record("pre_outer", module, ctx.global_step)
        return args, kwargs

    def pre_forward_module(self, ctx: RunContext, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        self.record("pre", module, sorted(kwargs))
        return args, kwargs

    def pre_forward_tensor(self, ctx: RunContext, module: nn.Module, index: int, tensor: torch.Tensor) -> Any:
        self.record("pre_t", module, index)
        return tensor

    def post_forward_module(self, ctx: RunContext, module: nn.Module, args: tuple, outputs: Any) -> Any:
        self.record("post", module)
        return outputs

    def post_forward_tensor(self, ctx: RunContext, module: nn.Module, index: int, tensor: torch.Tensor) -> Any:
        self.record("post_t", module, index)
        return tensor

    def post_forward_outermost_module(self, ctx: RunContext, module: nn.Module, args: tuple, outputs: Any) -> Any:
        self.record("post_outer", module, ctx.global_step)
        return outputs


@pytest.fixture
def net() -> Net:
    torch.manual_seed(0)
    return Net()


def subscribe(net: Net, *tags: str, **window: int) -> tuple[SubscriberManager, list[tuple]]:
    log: list[tuple] = []
    names = {module: name or "root" for name, module in net.named_modules()}
    manager = SubscriberManager()
    manager.subscribe(net, [Recorder(log, names, tag, **window) for tag in tags or ("r",)])
    return manager, log


def test_calls_fire_per_module_in_execution_order(net: Net) -> None:
    _, log = subscribe(net)
    net(torch.randn(3, 4), mask=torch.ones(3, 4))
    assert [entry[1:] for entry in log] == [
        ("pre_outer", "root", 0),
        ("pre", "root", ["mask"]),
        ("pre_t", "root", 0),
        ("pre_t", "root", 1),  # the mask, passed by keyword
        ("pre", "block", ["mask", "scale"]),
        ("pre_t", "block", 0),
        ("pre_t", "block", 1),  # scale is a float: not a tensor
        ("pre", "block.linear", []),
        ("pre_t", "block.linear", 0),
        ("post", "block.linear", None),
        ("post_t", "block.linear", 0),
        ("post", "block", None),
        ("post_t", "block", 0),
        ("post_t", "block", 1),  # aux's x; its None is skipped
        ("pre", "head", []),
        ("pre_t", "head", 0),
        ("post", "head", None),
        ("post_t", "head", 0),
        ("post", "root", None),
        ("post_t", "root", 0),
        ("post_outer", "root", 0),
    ]


def test_subscribers_run_in_order_each_module_level_then_tensor_level(net: Net) -> None:
    _, log = subscribe(net, "a", "b")
    net.head(torch.randn(1, 4))  # a child called on its own: no outermost calls
    assert [(tag, event) for tag, event, *_ in log] == [
        ("a", "pre"), ("a", "pre_t"), ("b", "pre"), ("b", "pre_t"),
        ("a", "post"), ("a", "post_t"), ("b", "post"), ("b", "post_t"),
    ]  # fmt: skip
    net(torch.randn(1, 4))
    outer = [(tag, event) for tag, event, *_ in log if "outer" in event]
    assert outer == [("a", "pre_outer"), ("b", "pre_outer"), ("a", "post_outer"), ("b", "post_outer")]


class Rewriter(SubscriberBase):
    """Changes a keyword argument, doubles every tensor entering `block`, zeroes what leaves `head`."""

    def __init__(self, net: Net) -> None:
        super().__init__()
        self.net = net

    def pre_forward_module(self, ctx: RunContext, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        if module is self.net.block:
            kwargs = {**kwargs, "scale": 3.0}
        return args, kwargs

    def pre_forward_tensor(self, ctx: RunContext, module: nn.Module, index: int, tensor: torch.Tensor) -> Any:
        return tensor * 2 if module is self.net.block else tensor

    def post_forward_tensor(self, ctx: RunContext, module: nn.Module, index: int, tensor: torch.Tensor) -> Any:
        return torch.zeros_like(tensor) if module is self.net.head and ctx.global_step > 0 else tensor


def test_replaced_inputs_kwargs_and_outputs_reach_the_computation(net: Net) -> None:
    x, mask = torch.randn(3, 4), torch.rand(3, 4)
    expected = net.head(net.block.linear(x * 2) * 3.0 * (mask * 2))
    manager = SubscriberManager()
    manager.subscribe(net, [Rewriter(net)])
    assert torch.allclose(net(x, mask=mask), expected)
    assert torch.equal(net(x, mask=mask), torch.zeros(3, 2))


def test_gradients_flow_through_hooked_modules(net: Net) -> None:
    x = torch.randn(3, 4)
    net(x).square().sum().backward()
    expected = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    subscribe(net)
    net(x).square().sum().backward()
    assert all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), expected, strict=True))


def test_outermost_calls_once_per_forward_and_step_advances_once(net: Net) -> None:
    manager, log = subscribe(net)
    for _ in range(3):
        net(torch.randn(2, 4))
    assert [(event, step) for _, event, _, step in log if "outer" in event] == [
        ("pre_outer", 0), ("post_outer", 0), ("pre_outer", 1), ("post_outer", 1), ("pre_outer", 2), ("post_outer", 2),
    ]  # fmt: skip
    assert manager.run_context.global_step == 3


def test_a_module_called_twice_gets_two_calls_but_the_step_advances_once() -> None:
    shared = nn.Linear(2, 2)
    root = nn.Sequential(shared, nn.ReLU(), shared)
    manager, log = SubscriberManager(), []
    manager.subscribe(root, [Recorder(log, {root: "root", shared: "shared", root[1]: "relu"})])
    root(torch.randn(1, 2))
    assert [name for _, event, name, _ in log if event == "pre"] == ["root", "shared", "relu", "shared"]
    assert sum(event == "pre_outer" for _, event, *_ in log) == 1
    assert manager.run_context.global_step == 1


def test_step_does_not_advance_while_exporting(net: Net) -> None:
    manager, log = subscribe(net)
    net(torch.randn(2, 4))
    with exporting():
        with exporting():
            assert is_exporting()
            net(torch.randn(2, 4))
        assert is_exporting()
        net(torch.randn(2, 4))
    assert not is_exporting()
    assert manager.run_context.global_step == 1
    assert sum(event == "post_outer" for _, event, *_ in log) == 3, "hooks still run while exporting"
    net(torch.randn(2, 4))
    assert manager.run_context.global_step == 2


def test_step_window(net: Net) -> None:
    manager, log = subscribe(net, start_step=1, end_step=3)
    for _ in range(5):
        net(torch.randn(2, 4))
    assert [step for _, event, _, step in log if event == "pre_outer"] == [1, 2]
    assert sum(event == "pre" for _, event, *_ in log) == 2 * 4, "4 modules in each of the 2 active steps"
    assert manager.run_context.global_step == 5


def test_unsubscribe_removes_every_hook(net: Net) -> None:
    hook_dicts = [
        "_forward_pre_hooks",
        "_forward_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks_with_kwargs",
    ]
    manager, log = subscribe(net)
    assert all(module._forward_pre_hooks for module in net.modules())
    manager.unsubscribe()
    for module in net.modules():
        for hooks in hook_dicts:
            assert not getattr(module, hooks), f"{hooks} left on {type(module).__name__}"
    net(torch.randn(2, 4))
    assert log == []
    manager.subscribe(net, [Recorder(log, {m: n or "root" for n, m in net.named_modules()})])
    net(torch.randn(2, 4))
    assert log, "subscribing again after unsubscribe must work"


def test_subscribing_twice_is_refused(net: Net) -> None:
    manager, _ = subscribe(net)
    with pytest.raises(RuntimeError, match="already subscribed"):
        manager.subscribe(net, [])


class Wrapper(nn.Module):
    """Like ORTModule: modules() lists the wrapped model's modules, not the wrapper itself."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def modules(self):  # type: ignore[override]
        yield from self.inner.modules()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_a_wrapper_that_hides_itself_gets_the_outermost_calls(net: Net) -> None:
    wrapper = Wrapper(net)
    log: list[tuple] = []
    names = {module: name or "root" for name, module in net.named_modules()} | {wrapper: "wrapper"}
    SubscriberManager().subscribe(wrapper, [Recorder(log, names)])
    wrapper(torch.randn(3, 4))
    outer = [entry[1:3] for entry in log if entry[1] in ("pre_outer", "post_outer")]
    assert outer == [("pre_outer", "wrapper"), ("post_outer", "wrapper")]
    modules = [entry[2] for entry in log if entry[1] == "pre"]
    assert modules == ["wrapper", "root", "block", "block.linear", "head"]
