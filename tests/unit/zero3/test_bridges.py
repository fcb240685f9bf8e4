"""The three ZeRO-3 bridges applied by hand, one at a time, and the per-module state registry behind their keys.

Each bridge must be an identity for values and gradients (the exporter turns it into a PythonOp that ORT runs in
the middle of the graph) and make exactly the DeepSpeed call it stands for, at the right moment. The fake offload
of conftest.py logs those calls; `subscribe` registers the module states the bridges look up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from deepspeed.runtime.zero import parameter_offload
from deepspeed.utils import set_z3_leaf_module
from torch import nn

from ort_zero.hooks import exporting
from ort_zero.zero3 import state as zero3_state
from ort_zero.zero3.bridges import PostForwardBridge, PreForwardBridge, StepStartBridge


def registered(subscribe: Callable[[nn.Module], Any], module: nn.Module) -> tuple[zero3_state.ModuleState, Any]:
    """The state registered for `module` (subscribed alone) and the fake offload that logs its calls."""
    subscribed = subscribe(module)
    return subscribed.subscriber.states[module], subscribed.offload


def apply(bridge: str, module_state: zero3_state.ModuleState, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Apply a bridge as the subscriber does (post-forward expects its module on DeepSpeed's forward stack)."""
    if bridge == "step_start":
        return StepStartBridge.apply(module_state.key, *tensors)
    if bridge == "pre_forward":
        return PreForwardBridge.apply(module_state.key, len(tensors), *tensors)
    parameter_offload.FWD_MODULE_STACK.append(module_state.module)
    return PostForwardBridge.apply(module_state.key, *tensors)


BRIDGES = ["step_start", "pre_forward", "post_forward"]


@pytest.mark.parametrize("bridge", BRIDGES)
def test_values_pass_through_and_gradcheck_holds(subscribe: Callable, bridge: str) -> None:
    """Numeric and analytic Jacobians agree and are the identity: the bridge changes no number."""
    module_state, _ = registered(subscribe, nn.Linear(2, 2))
    a = torch.randn(3, 2, dtype=torch.double, requires_grad=True)
    b = torch.randn(4, dtype=torch.double, requires_grad=True)
    with exporting():  # gradcheck runs forward many times; keep the fake's stack and counters out of it
        outputs = apply(bridge, module_state, a, b)
        assert all(torch.equal(o, i) for o, i in zip(outputs, (a, b), strict=True))
        assert torch.autograd.gradcheck(lambda x, y: apply(bridge, module_state, x, y), (a, b))


@pytest.mark.parametrize("bridge", BRIDGES)
def test_unused_outputs_get_zero_gradients(subscribe: Callable, bridge: str) -> None:
    """ORT's gradient Sum nodes need a tensor for every input that requires grad, even when its output was unused."""
    module_state, _ = registered(subscribe, nn.Linear(2, 2))
    used, unused = torch.randn(3, requires_grad=True), torch.randn(2, 5, requires_grad=True)
    with exporting():  # one bridge alone is no module's lifecycle: keep DeepSpeed's calls out of it
        out_used, _ = apply(bridge, module_state, used, unused)
    (out_used * 2).sum().backward()
    torch.testing.assert_close(used.grad, torch.full((3,), 2.0))
    assert unused.grad is not None, "no gradient materialized for the unused output"
    assert torch.equal(unused.grad, torch.zeros(2, 5))


def test_step_start_resets_the_coordinator(subscribe: Callable) -> None:
    module_state, offload = registered(subscribe, nn.Linear(2, 2))
    StepStartBridge.apply(module_state.key, torch.randn(2))
    assert offload.take() == [("reset_step", "")]


def forward_call(module_state: zero3_state.ModuleState, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """One forward of the module through both bridges, as the subscriber makes it: its output and its call."""
    (inner,) = apply("pre_forward", module_state, x)
    call = module_state.open_calls[-1]
    (output,) = apply("post_forward", module_state, inner * 2)
    return output, call


def test_a_module_used_twice_is_released_after_each_backward(subscribe: Callable) -> None:
    """Each call's phase moves on its own; the parameters are released after a call's backward (here the later
    use's first, as autograd orders them), and gathered and released again for the other's."""
    module_state, offload = registered(subscribe, nn.Linear(2, 2))
    x = torch.randn(2, requires_grad=True)
    first, first_call = forward_call(module_state, x)
    second, second_call = forward_call(module_state, x)
    assert offload.take() == [("fwd_gather", "root"), ("fwd_release", "root")] * 2
    assert first_call.phase == second_call.phase == zero3_state.Phase.AFTER_FORWARD
    second.sum().backward()
    assert offload.take() == [("bwd_gather", "root"), ("bwd_release", "root")]
    assert (first_call.phase, second_call.phase) == (zero3_state.Phase.AFTER_FORWARD, zero3_state.Phase.DONE)
    first.sum().backward()
    assert offload.take() == [("bwd_gather", "root"), ("bwd_release", "root")]
    assert first_call.phase == zero3_state.Phase.DONE
    torch.testing.assert_close(x.grad, torch.full((2,), 4.0))


def test_no_release_while_another_call_is_in_its_backward(subscribe: Callable) -> None:
    """ORT may gather a module used twice for both backwards before either ends (ProphetNet's output Linear): the
    first end must not release what the other's backward still reads."""
    module_state, offload = registered(subscribe, nn.Linear(2, 2))
    first, second = module_state.gather_for_forward(), None
    module_state.release_after_forward()
    second = module_state.gather_for_forward()
    module_state.release_after_forward()
    offload.take()
    module_state.gather_for_backward(second)
    module_state.gather_for_backward(first)
    module_state.backward_done(second)
    assert offload.take() == [("bwd_gather", "root"), ("bwd_gather", "root")], "released under the other backward"
    module_state.backward_done(first)
    assert offload.take() == [("bwd_release", "root")]


def test_a_backward_that_never_ends_does_not_hold_the_next_step(subscribe: Callable) -> None:
    """A call whose inputs needed no gradient is gathered for its backward and never ends it here: the next step's
    backward of the module still releases."""
    module_state, offload = registered(subscribe, nn.Linear(2, 2))
    stuck = module_state.gather_for_forward()
    module_state.release_after_forward()
    module_state.gather_for_backward(stuck)
    module_state.start_step()
    call = module_state.gather_for_forward()
    module_state.release_after_forward()
    module_state.gather_for_backward(call)
    offload.take()
    module_state.backward_done(call)
    assert offload.take() == [("bwd_release", "root")] and module_state.backward_calls == []


def test_a_forward_left_unfinished_is_abandoned_at_the_next_step(subscribe: Callable) -> None:
    """A checkpoint's recompute that stops early never runs its modules' releases: the next step's forward of the
    module marks that call abandoned and forgets it, while a call begun inside its own forward stays open."""
    module_state, _ = registered(subscribe, nn.Linear(2, 2))
    x = torch.randn(2, requires_grad=True)
    apply("pre_forward", module_state, x)
    unfinished = module_state.open_calls[-1]
    apply("pre_forward", module_state, x)
    assert module_state.open_calls == [unfinished, module_state.open_calls[-1]], "a nested call was dropped"
    apply("step_start", module_state, x)
    apply("pre_forward", module_state, x)
    assert unfinished.phase == zero3_state.Phase.ABANDONED and len(module_state.open_calls) == 1


def test_a_move_out_of_order_is_an_error_naming_the_module(subscribe: Callable) -> None:
    """A backward through a call whose forward never ended, a second backward through one call: no silent count."""
    module_state, _ = registered(subscribe, nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="Linear ended a forward it never began"):
        module_state.release_after_forward()
    x = torch.randn(2, requires_grad=True)
    (unfinished,) = apply("pre_forward", module_state, x)
    with pytest.raises(RuntimeError, match="backward_done for a call of Linear .* gathered for its forward"):
        unfinished.sum().backward()
    output, _ = forward_call(module_state, x)
    output.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="gather_for_backward for a call of Linear .* past its backward.*bug"):
        output.sum().backward()


def test_pre_forward_without_gradient_inputs_ends_no_backward(subscribe: Callable) -> None:
    """Its inputs need no gradient: its backward does not end there (a parameter gradient may still pass)."""
    module_state, offload = registered(subscribe, nn.Linear(2, 2))
    (inner,) = apply("pre_forward", module_state, torch.randn(2))
    call = module_state.open_calls[-1]
    (output,) = apply("post_forward", module_state, inner * torch.ones(2, requires_grad=True))
    output.sum().backward()
    assert offload.take() == [("fwd_gather", "root"), ("fwd_release", "root"), ("bwd_gather", "root")]
    assert call.phase == zero3_state.Phase.BACKWARD and module_state.backward_calls == [call]


def test_post_forward_releases_then_gathers_once_per_application(subscribe: Callable) -> None:
    """The module leaves DeepSpeed's forward stack before its release; one backward gather covers all outputs."""
    module_state, offload = registered(subscribe, nn.Linear(2, 2))
    (x,) = apply("pre_forward", module_state, torch.randn(2, requires_grad=True))
    call = module_state.open_calls[-1]
    parameter_offload.FWD_MODULE_STACK.pop()  # `apply` pushes the module for the release, as the fake gather did
    a, b = apply("post_forward", module_state, x * 1, x * 2)
    assert parameter_offload.FWD_MODULE_STACK == ["<root marker>"]
    assert offload.stack_at_release == [["<root marker>"]]
    assert offload.take() == [("fwd_gather", "root"), ("fwd_release", "root")]
    assert call.phase == zero3_state.Phase.AFTER_FORWARD and module_state.open_calls == []
    (a + b).sum().backward()
    assert offload.take() == [("bwd_gather", "root"), ("bwd_release", "root")]
    assert call.phase == zero3_state.Phase.DONE


def test_no_deepspeed_call_while_exporting(subscribe: Callable) -> None:
    """A collective inside the ONNX exporter's trace breaks the export: bridges only pass values then."""
    module_state, offload = registered(subscribe, nn.Linear(2, 2))
    x = torch.randn(2, requires_grad=True)
    with exporting():
        for bridge in BRIDGES:
            (x,) = apply(bridge, module_state, x)
        parameter_offload.FWD_MODULE_STACK.pop()  # what `apply` pushed for the post-forward bridge
    assert module_state.open_calls == [] and module_state.backward_calls == []
    assert parameter_offload.FWD_MODULE_STACK == ["<root marker>"]
    x.sum().backward()
    assert offload.take() == []


def test_placeholders_become_full_parameters_whose_gradients_reach_them(
    subscribe: Callable, deepspeed_init: Callable
) -> None:
    """In an ORT graph the bridge outputs the gathered parameters; their gradients come back through param.backward."""
    linear = nn.Linear(3, 2)
    linear.bias.requires_grad_(False)
    deepspeed_init(linear)
    module_state, _ = registered(subscribe, linear)
    x = torch.randn(4, 3, requires_grad=True)
    placeholders = [torch.zeros(1, requires_grad=True) for _ in range(2)]
    y, weight, bias = PreForwardBridge.apply(module_state.key, 1, x, *placeholders)
    assert torch.equal(weight, linear.weight) and weight is not linear.weight
    assert weight.requires_grad
    (output,) = apply("post_forward", module_state, nn.functional.linear(y, weight, bias))
    output.square().sum().backward()

    reference = x.detach().clone().requires_grad_()
    expected_weight = linear.weight.detach().clone().requires_grad_()
    nn.functional.linear(reference, expected_weight, linear.bias.detach()).square().sum().backward()
    torch.testing.assert_close(linear.weight.grad, expected_weight.grad)
    torch.testing.assert_close(x.grad, reference.grad)
    assert linear.bias.grad is None, "a frozen parameter must not get a gradient"
    assert all(torch.equal(p.grad, torch.zeros(1)) for p in placeholders)


def test_placeholder_count_must_match_the_exported_parameters(subscribe: Callable, deepspeed_init: Callable) -> None:
    linear = nn.Linear(3, 2)
    deepspeed_init(linear)
    linear.ds_id = 0  # setup_zero_stage3_hooks numbers modules; the message names it
    module_state, _ = registered(subscribe, linear)
    with pytest.raises(RuntimeError, match="exported with 1 partitioned parameters but now has 2"):
        PreForwardBridge.apply(module_state.key, 1, torch.randn(3), torch.zeros(1))


@pytest.mark.parametrize("leaf", [True, False])
def test_z3_leaf_reduce_hooks_run_from_the_bridge_backward(
    subscribe: Callable, deepspeed_init: Callable, leaf: bool
) -> None:
    """DeepSpeed reduces a leaf module's gradients in a module backward hook that ORT never triggers."""
    block = nn.Sequential(nn.Linear(2, 2))
    set_z3_leaf_module(block, leaf)
    deepspeed_init(block)
    calls: list[nn.Module] = []
    block.register_full_backward_hook(lambda module, grad_in, grad_out: calls.append(module))
    module_state, _ = registered(subscribe, block)
    x = torch.randn(2, requires_grad=True)
    placeholders = [torch.zeros(1) for _ in module_state.bridged_params()]
    assert len(placeholders) == (2 if leaf else 0), "a leaf module gathers the parameters below it"
    y, *params = PreForwardBridge.apply(module_state.key, 1, x, *placeholders)
    (output,) = apply("post_forward", module_state, y.sum() + sum(p.sum() for p in params))
    output.backward()
    assert calls == ([block] if leaf else [])


def test_parameter_shape_inference_reports_full_shapes(subscribe: Callable, deepspeed_init: Callable) -> None:
    """ORT infers a bridge's parameter outputs from `ds_shape`: partitioned parameters hold (0)-sized data."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime.training")
    linear = nn.Linear(3, 2)
    deepspeed_init(linear)
    for param in linear.parameters():
        param.data = torch.empty(0)
    module_state, _ = registered(subscribe, linear)
    node = onnx.helper.make_node(
        "PythonOp", ["x", "p0", "p1"], ["ctx", "y", "w", "b"], input_int_scalars=[module_state.key, 1]
    )
    shapes, dtypes = PreForwardBridge.infer_shape(node, [[4, 3], [1], [1]], [1, 1, 1])
    assert shapes == [[4, 3], [2, 3], [2]]
    assert dtypes == [1, onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT]
    with pytest.raises(RuntimeError, match="not an ort_zero bridge"):
        PreForwardBridge.infer_shape(onnx.helper.make_node("PythonOp", [], [], "other"), [], [])
