"""The small hand-built training graphs the recompute tests (`recompute/`) run the pass on.

The model: a root module holding a ModuleList of two like layers (each with an inner module owning one partitioned
4x4 weight) and a final module outside the layers that owns a weight too. Each layer's forward region is
    layer PreForwardBridge -> inner PreForwardBridge (gathers W) -> MatMul(x, W) -> Dropout
    -> inner PostForwardBridge -> layer PostForwardBridge
and its backward, as ORT's gradient graph has it: PythonOpGrad anchors for the PostForwardBridges, a DropoutGrad
reading the forward's mask, a Mul reading the MatMul's output, the input gradient through a Transpose of W and the
weight gradient through a Reshape and Transpose of the layer's input: views computed from forward values alone
("floating" nodes, neither forward nor descendants of the YieldOp).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.python_op import MS_DOMAIN, function_name  # noqa: E402
from ort_zero.zero3 import state as zero3_state  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge, PreForwardBridge, StepStartBridge  # noqa: E402

FLOAT = TensorProto.FLOAT
FOREIGN = "user_code.ScaleFunction"  # an autograd Function of the user's: a PythonOp that is not an ort_zero bridge


# ----------------------------------------------------------------------------------------------------------------
# The model and its module states


class Inner(torch.nn.Module):
    """A module with one partitioned parameter, as DeepSpeed leaves it: an empty tensor with `ds_shape` 4x4."""

    def __init__(self, ds_id: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(0))
        self.weight.ds_id, self.weight.ds_shape = ds_id, torch.Size([4, 4])


class Layer(torch.nn.Module):
    def __init__(self, ds_id: int) -> None:
        super().__init__()
        self.inner = Inner(ds_id)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(0), Layer(1)])
        self.final = Inner(2)


@dataclass
class Keys:
    """Module-state keys of the model's modules (the bridges' first integer scalar)."""

    root: int
    layers: list[int]
    inners: list[int]
    final: int


@pytest.fixture
def model() -> Iterator[tuple[Model, Keys]]:
    from deepspeed.runtime.zero.partition_parameters import _init_external_params

    model = Model()
    states = {}
    for ds_id, module in enumerate(model.modules()):
        module.ds_id = ds_id
        _init_external_params(module)
        state = zero3_state.register(module, offload=None)
        state.exported_params = list(module.parameters(recurse=False))
        states[module] = state
    keys = Keys(
        root=states[model].key,
        layers=[states[layer].key for layer in model.layers],
        inners=[states[layer.inner].key for layer in model.layers],
        final=states[model.final].key,
    )
    yield model, keys
    for state in states.values():
        zero3_state.unregister(state)


@pytest.fixture
def keys(model: tuple[Model, Keys]) -> Keys:
    return model[1]


# ----------------------------------------------------------------------------------------------------------------
# Building training graphs


def python_op(func: str, name: str, inputs: list[str], outputs: list[str], scalars: list[int]) -> onnx.NodeProto:
    """A PythonOp as ORT's exporter writes it (output 0 is the autograd context)."""
    scalar_attributes = {"input_int_scalars": scalars} if scalars else {}
    return helper.make_node(
        "PythonOp", inputs, outputs, name, domain=MS_DOMAIN, func_name=func, **scalar_attributes,
        input_tensor_ranks=[2] * len(inputs), input_tensor_types=[FLOAT] * len(inputs),
        output_tensor_ranks=[2] * (len(outputs) - 1), output_tensor_types=[FLOAT] * (len(outputs) - 1),
    )  # fmt: skip


def bridge(func: type, name: str, inputs: list[str], outputs: list[str], scalars: list[int]) -> onnx.NodeProto:
    return python_op(function_name(func), name, inputs, outputs, scalars)


def grad_op(name: str, ctx: str, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    return helper.make_node(
        "PythonOpGrad", [ctx, *inputs], outputs, name, domain=MS_DOMAIN,
        output_tensor_ranks=[2] * len(outputs), output_tensor_types=[FLOAT] * len(outputs),
    )  # fmt: skip


@dataclass
class Call:
    """One run of a layer's forward in the graph: `tag` prefixes its node and value names."""

    tag: str
    layer: int  # the layer's key
    inner: int  # its inner module's key
    foreign: str | None = None  # where a foreign PythonOp sits: "before_dropout" or "before_inner"
    function: str = FOREIGN  # the Function that PythonOp runs


class TrainingGraph:
    """Forward and backward node lists of a hand-built training graph."""

    def __init__(self) -> None:
        self.forward: list[onnx.NodeProto] = []
        self.backward: list[onnx.NodeProto] = []
        self.placeholders: list[str] = []
        self.grads: list[str] = []

    def layer_forward(self, call: Call, x: str) -> str:
        t, fwd = call.tag, self.forward.append
        inner_input = f"{t}_x"
        fwd(bridge(PreForwardBridge, f"{t}_pre", [x], [f"{t}_pre_ctx", f"{t}_x"], [call.layer, 1]))
        if call.foreign == "before_inner":  # e.g. a fused attention Function feeding an output projection
            fwd(python_op(call.function, f"{t}_foreign", [f"{t}_x"], [f"{t}_foreign_ctx", f"{t}_xf"], []))
            inner_input = f"{t}_xf"
        self.placeholders.append(f"{t}_placeholder")
        fwd(
            bridge(
                PreForwardBridge,
                f"{t}_inner_pre",
                [inner_input, f"{t}_placeholder"],
                [f"{t}_inner_pre_ctx", f"{t}_xi", f"{t}_w"],
                [call.inner, 1],
            )
        )
        fwd(helper.make_node("MatMul", [f"{t}_xi", f"{t}_w"], [f"{t}_h"], f"{t}_matmul"))
        dropout_input = f"{t}_h"
        if call.foreign == "before_dropout":
            fwd(python_op(call.function, f"{t}_foreign", [f"{t}_h"], [f"{t}_foreign_ctx", f"{t}_hf"], []))
            dropout_input = f"{t}_hf"
        fwd(helper.make_node("Dropout", [dropout_input, "ratio", "training"], [f"{t}_d", f"{t}_mask"], f"{t}_dropout"))
        fwd(bridge(PostForwardBridge, f"{t}_inner_post", [f"{t}_d"], [f"{t}_inner_post_ctx", f"{t}_di"], [call.inner]))
        fwd(bridge(PostForwardBridge, f"{t}_post", [f"{t}_di"], [f"{t}_post_ctx", f"{t}_out"], [call.layer]))
        return f"{t}_out"

    def layer_backward(self, call: Call, grad: str) -> str:
        t, bwd = call.tag, self.backward.append
        bwd(grad_op(f"{t}_post_grad", f"{t}_post_ctx", [grad], [f"{t}_g_di"]))  # the region's anchor
        bwd(grad_op(f"{t}_inner_post_grad", f"{t}_inner_post_ctx", [f"{t}_g_di"], [f"{t}_g_d"]))
        dropout_grad = f"{t}_g_hf" if call.foreign == "before_dropout" else f"{t}_g_h0"
        bwd(
            helper.make_node(
                "DropoutGrad",
                [f"{t}_g_d", f"{t}_mask", "ratio", "training"],
                [dropout_grad],
                f"{t}_dropout_grad",
                domain=MS_DOMAIN,
            )
        )
        if call.foreign == "before_dropout":
            bwd(grad_op(f"{t}_foreign_grad", f"{t}_foreign_ctx", [f"{t}_g_hf"], [f"{t}_g_h0"]))
        bwd(helper.make_node("Mul", [f"{t}_g_h0", f"{t}_h"], [f"{t}_g_h"], f"{t}_act_grad"))  # reads the MatMul's
        bwd(helper.make_node("Transpose", [f"{t}_w"], [f"{t}_wt"], f"{t}_w_view"))  # floating
        bwd(helper.make_node("MatMul", [f"{t}_g_h", f"{t}_wt"], [f"{t}_g_xi"], f"{t}_dx"))
        bwd(helper.make_node("Reshape", [f"{t}_xi", "flat_shape"], [f"{t}_xflat"], f"{t}_x_flat"))  # floating
        bwd(helper.make_node("Transpose", [f"{t}_xflat"], [f"{t}_xflat_t"], f"{t}_x_flat_t"))  # floating
        bwd(helper.make_node("MatMul", [f"{t}_xflat_t", f"{t}_g_h"], [f"{t}_g_w"], f"{t}_dw"))
        inner_grads = [f"{t}_g_x", f"{t}_g_placeholder"]
        bwd(grad_op(f"{t}_inner_pre_grad", f"{t}_inner_pre_ctx", [f"{t}_g_xi", f"{t}_g_w"], inner_grads))
        self.grads.append(f"{t}_g_placeholder")
        layer_grad = f"{t}_g_x"
        if call.foreign == "before_inner":
            bwd(grad_op(f"{t}_foreign_grad", f"{t}_foreign_ctx", [f"{t}_g_x"], [f"{t}_g_x0"]))
            layer_grad = f"{t}_g_x0"
        bwd(grad_op(f"{t}_pre_grad", f"{t}_pre_ctx", [layer_grad], [f"{t}_g_in"]))
        return f"{t}_g_in"

    def final_forward(self, key: int, x: str) -> str:
        fwd = self.forward.append
        self.placeholders.append("final_placeholder")
        fwd(
            bridge(
                PreForwardBridge,
                "final_pre",
                [x, "final_placeholder"],
                ["final_pre_ctx", "final_x", "final_w"],
                [key, 1],
            )
        )
        fwd(helper.make_node("MatMul", ["final_x", "final_w"], ["final_h"], "final_matmul"))
        fwd(bridge(PostForwardBridge, "final_post", ["final_h"], ["final_post_ctx", "final_out"], [key]))
        return "final_out"

    def final_backward(self, grad: str) -> str:
        bwd = self.backward.append
        bwd(grad_op("final_post_grad", "final_post_ctx", [grad], ["final_g_h0"]))
        bwd(helper.make_node("Mul", ["final_g_h0", "final_h"], ["final_g_h"], "final_act_grad"))
        bwd(helper.make_node("Transpose", ["final_w"], ["final_wt"], "final_w_view"))
        bwd(helper.make_node("MatMul", ["final_g_h", "final_wt"], ["final_g_x"], "final_dx"))
        bwd(helper.make_node("Transpose", ["final_x"], ["final_xt"], "final_x_view"))
        bwd(helper.make_node("MatMul", ["final_xt", "final_g_h"], ["final_g_w"], "final_dw"))
        bwd(grad_op("final_pre_grad", "final_pre_ctx", ["final_g_x", "final_g_w"], ["final_g_in", "final_g_ph"]))
        self.grads.append("final_g_ph")
        return "final_g_in"


def training_graph(keys: Keys, calls: list[Call] | None = None) -> onnx.GraphProto:
    """StepStart -> root PreForward -> the layer calls -> final module -> root PostForward -> YieldOp, and the
    backward in reverse."""
    calls = calls if calls is not None else layer_calls(keys)
    built = TrainingGraph()
    built.forward.append(bridge(StepStartBridge, "step_start", ["x"], ["step_ctx", "x0"], [keys.root]))
    built.forward.append(bridge(PreForwardBridge, "root_pre", ["x0"], ["root_pre_ctx", "a0"], [keys.root, 1]))
    value = "a0"
    for call in calls:
        value = built.layer_forward(call, value)
    value = built.final_forward(keys.final, value)
    built.forward.append(bridge(PostForwardBridge, "root_post", [value], ["root_post_ctx", "y"], [keys.root]))
    built.forward.append(helper.make_node("YieldOp", ["y"], ["dy"], "yield", domain=MS_DOMAIN))

    built.backward.append(grad_op("root_post_grad", "root_post_ctx", ["dy"], ["g_final"]))
    grad = built.final_backward("g_final")
    for call in reversed(calls):
        grad = built.layer_backward(call, grad)
    built.backward.append(grad_op("root_pre_grad", "root_pre_ctx", [grad], ["g_x0"]))
    built.backward.append(grad_op("step_grad", "step_ctx", ["g_x0"], ["x_grad"]))
    return helper.make_graph(
        built.forward + built.backward, "training",
        [helper.make_tensor_value_info(name, FLOAT, None) for name in ("x", *built.placeholders)],
        [helper.make_tensor_value_info(name, FLOAT, None) for name in ("x_grad", *built.grads)],
        initializer=[
            helper.make_tensor("ratio", FLOAT, [], [0.1]),
            helper.make_tensor("training", TensorProto.BOOL, [], [True]),
            helper.make_tensor("flat_shape", TensorProto.INT64, [2], [-1, 4]),
        ],
    )  # fmt: skip


def layer_calls(keys: Keys, foreign: dict[int, str] | None = None) -> list[Call]:
    foreign = foreign or {}
    return [Call(f"l{i}", keys.layers[i], keys.inners[i], foreign.get(i)) for i in range(2)]


# ----------------------------------------------------------------------------------------------------------------
# Reading graphs


# ----------------------------------------------------------------------------------------------------------------
# One pass-through PythonOp (the buffer and YieldOp tests)

REUSE = "tensor_reuse_map"


def pass_through(func: str, name: str, inputs: list[str], key: int) -> onnx.NodeProto:
    outputs = [f"{name}_ctx", *(f"{name}_{i}" for i in range(len(inputs)))]
    return helper.make_node("PythonOp", inputs, outputs, name, domain=MS_DOMAIN, func_name=func,
                            input_int_scalars=[key], tensor_reuse_map=[-1, *range(len(inputs))])  # fmt: skip
