"""The PythonOp layout of the ZeRO-3 bridges, declared once: how ORT's graph carries a bridge call, and how the passes
read and build one (`BridgeNode`).

Every bridge's PythonOp has its integer arguments as scalars, the module key first; output 0 is ORT's autograd
context (its gradient node reads it as input 0); the tensor outputs follow:

    StepStartBridge, PostForwardBridge  scalars [key]               outputs: the tensor inputs, passed through
    PreForwardBridge                    scalars [key, input_count]  outputs: the module's input_count tensor inputs,
                                                                    passed through, then one full-sized tensor per
                                                                    partitioned parameter (whose inputs, after the
                                                                    module's, are placeholders)
    RecomputeStartBridge                scalars [key]               input 0 a value to wait for; outputs: copies of
                                                                    the other inputs
    BackwardParamsBridge,               scalars [key, *ds_ids]      input 0 a value to wait for; outputs: the
    RecomputeParamsBridge                                           parameters, gathered
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..python_op import (
    context_of,
    function_name,
    function_name_of,
    int_scalars,
    ints_attribute,
    make_python_op,
    onnx_dtype,
    set_ints_attribute,
)
from .ort_bridges import RecomputeStartBridge

if TYPE_CHECKING:
    import onnx

Typed = tuple[str, int, int]  # a value: (name, rank, ONNX element type)


@dataclass(frozen=True, eq=False)
class BridgeNode:
    """One bridge's PythonOp, read by the layout above (its integer arguments by the names `bridge.SCALARS` gives
    them, as its `forward` takes them)."""

    node: onnx.NodeProto
    bridge: type[torch.autograd.Function]

    @classmethod
    def of(cls, node: onnx.NodeProto, bridge: type[torch.autograd.Function]) -> BridgeNode | None:
        """`node` as a call of `bridge`; None when it calls anything else."""
        return cls(node, bridge) if function_name_of(node) == function_name(bridge) else None

    def scalar(self, name: str) -> int:
        """The integer argument `forward` takes as `name`."""
        return int_scalars(self.node)[self.bridge.SCALARS.index(name)]

    @property
    def key(self) -> int:
        """The module's key (`state.lookup`)."""
        return self.scalar("key")

    @property
    def context(self) -> str:
        return context_of(self.node)

    @property
    def input_count(self) -> int:
        """How many tensor inputs pass through: a PreForwardBridge's module inputs; every input of the others."""
        if "input_count" in self.bridge.SCALARS:
            return self.scalar("input_count")
        return len(self.node.input)

    @property
    def outputs(self) -> list[str]:
        """The tensor outputs, the context left out."""
        return list(self.node.output[1:])

    @property
    def passed_outputs(self) -> list[str]:
        """The outputs that are tensor inputs passed through, in the inputs' order."""
        return self.outputs[: self.input_count]

    @property
    def param_outputs(self) -> list[str]:
        """A PreForwardBridge's full-sized parameters, after the passed-through inputs."""
        return self.outputs[self.input_count :]

    def output_for_input(self, index: int) -> str:
        """The output at tensor input `index`'s position: that input passed through, or its parameter's full size."""
        return self.outputs[index]

    def tensor_pairs(self) -> list[tuple[str, str]]:
        """(tensor input, the output at its position), for every input that has one."""
        return list(zip(self.node.input, self.outputs, strict=False))

    def passed_input(self, value: str) -> str | None:
        """The tensor input that output `value` passes through; None for a parameter output or the context."""
        slot = list(self.node.output).index(value)
        return self.node.input[slot - 1] if 0 < slot <= self.input_count else None

    def param_index(self, value: str) -> int | None:
        """Which of the bridge's parameters output `value` is; None for any other output."""
        outputs = self.param_outputs
        return outputs.index(value) if value in outputs else None

    def input_type(self, index: int) -> tuple[int, int]:
        """(rank, ONNX element type) declared for tensor input `index`."""
        return (
            ints_attribute(self.node, "input_tensor_ranks")[index],
            ints_attribute(self.node, "input_tensor_types")[index],
        )

    def passed_inputs_typed(self) -> list[Typed]:
        """The tensor inputs that pass through, with their declared ranks and types."""
        return [(self.node.input[j], *self.input_type(j)) for j in range(self.input_count)]

    def pass_another(self, value: Typed) -> str:
        """Adds tensor input `value` to a RecomputeStartBridge (or any bridge whose every input passes through) and
        returns the output that passes it on."""
        name, rank, elem_type = value
        output = f"{self.node.name}_{len(self.node.output) - 1}"
        self.node.input.append(name)
        self.node.output.append(output)
        for attribute in ("input_tensor_ranks", "output_tensor_ranks"):
            set_ints_attribute(self.node, attribute, [*ints_attribute(self.node, attribute), rank])
        for attribute in ("input_tensor_types", "output_tensor_types"):
            set_ints_attribute(self.node, attribute, [*ints_attribute(self.node, attribute), elem_type])
        for attribute in self.node.attribute:
            if attribute.name == "input_convention":
                attribute.s += b"d"
        return output

    @classmethod
    def recompute_start(cls, name: str, key: int, after: Typed, inputs: list[Typed]) -> BridgeNode:
        """A RecomputeStartBridge that runs once `after` exists and outputs copies of `inputs`, without autograd."""
        return cls(
            make_python_op(
                function_name(RecomputeStartBridge),
                name,
                int_scalars=[key],
                inputs=[after, *inputs],
                outputs=[(f"{name}_{j}", rank, elem_type) for j, (_, rank, elem_type) in enumerate(inputs)],
                training_mode=0,
            ),
            RecomputeStartBridge,
        )

    @classmethod
    def params_bridge(
        cls, bridge: type[torch.autograd.Function], name: str, key: int, params: list, after: Typed
    ) -> BridgeNode:
        """A Backward- or RecomputeParamsBridge that runs once `after` exists and outputs module `key`'s `params`
        gathered: `forward(ctx, key, after, *ds_ids)`, without autograd."""
        return cls(
            make_python_op(
                function_name(bridge),
                name,
                int_scalars=[key, *(p.ds_id for p in params)],
                inputs=[after],
                outputs=[(f"{name}_{j}", len(p.ds_shape), onnx_dtype(p.dtype)) for j, p in enumerate(params)],
                training_mode=0,
                input_convention="cd" + "c" * len(params),
            ),
            bridge,
        )
