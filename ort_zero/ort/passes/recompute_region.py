"""One region of the layer-wise recompute: its forward nodes, its anchor, and the copies that recompute what its
backward reads (`recompute.py` chooses the regions and applies them)."""

from __future__ import annotations

from collections.abc import Generator

import onnx
import torch

from ...python_op import function_name, function_name_of, ints_attribute
from ...zero3 import state as zero3_state
from ...zero3.bridges import PostForwardBridge, PreForwardBridge, StepStartBridge
from ...zero3.ort_bridges import RecomputeParamsBridge, RecomputeStartBridge
from ..graph.edit import make_params_bridge, make_python_op, set_ints_attribute
from ..graph.training_graph import TrainingGraphView
from ..torch_kernels import RECOMPUTABLE, draws_dropout

RECOMPUTE_SUFFIX = "_ort_zero_recompute"
START_PREFIX = "ort_zero_recompute_start"
_RANDOM = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial"})


class ForwardBridges:
    """The forward's bridge nodes per module key."""

    def __init__(self, view: TrainingGraphView) -> None:
        self.view = view
        self.pre: dict[int, list[int]] = {}
        self.post: dict[int, list[int]] = {}
        self.step_start_key: int | None = None
        names = {function_name(PreForwardBridge): self.pre, function_name(PostForwardBridge): self.post}
        for i in view.forward:
            node = view.nodes[i]
            name = function_name_of(node)
            if name in names:
                names[name].setdefault(ints_attribute(node, "input_int_scalars")[0], []).append(i)
            elif name == function_name(StepStartBridge):
                self.step_start_key = ints_attribute(node, "input_int_scalars")[0]
        self.keys = set(self.pre) | set(self.post)

    def root_module(self) -> torch.nn.Module:
        if self.step_start_key is not None:
            return zero3_state.lookup(self.step_start_key).module
        modules = [zero3_state.lookup(key).module for key in self.keys]
        return next(m for m in modules if all(any(x is n for x in m.modules()) for n in modules))


class Region:
    """One region: its forward nodes, its anchor, and the copies that recompute what its backward reads."""

    def __init__(self, view: TrainingGraphView, bridges: ForwardBridges, key: int, path: str, plan: str) -> None:
        self.view, self.key, self.path, self.plan = view, key, path, plan
        self.kept: list[str] = []
        self.skip_reason = ""
        pre, post = bridges.pre.get(key, []), bridges.post.get(key, [])
        if len(pre) != 1 or len(post) != 1:
            self.skip_reason = f"its forward runs {max(len(pre), len(post))} times in one step"
            return
        self.pre, self.post = pre[0], post[0]
        ctx = view.nodes[self.post].output[0]
        self.anchor = next((c for c in view.consumers.get(ctx, ()) if view.nodes[c].op_type == "PythonOpGrad"), None)
        if self.anchor is None:
            self.skip_reason = "no gradient flows through it"
            return
        inside = view.closure([self.pre], upward=False) & view.closure([self.post], upward=True)
        self.nodes = (inside & view.forward) - {self.pre, self.post}
        self.readers = _readers_after(view, self.anchor)
        self.copies: dict[str, str] = {}
        self.param_bridges: dict[int, onnx.NodeProto] = {}
        self.start: onnx.NodeProto | None = None
        self.anchored: set[str] = set()  # values computed after the anchor (outputs of the nodes added here)

    def rewire(self, new_nodes: list[onnx.NodeProto]) -> int:
        """Point the backward's reads of this region's values at recomputed copies; the number rewired."""
        self.new_nodes = new_nodes
        produced = {out for i in self.nodes for out in self.view.nodes[i].output[self._first_value(i) :] if out}
        rewired = 0
        for reader in sorted(self.readers):
            node = self.view.nodes[reader]
            for slot, value in enumerate(node.input):
                if value not in produced:
                    continue
                copy = self._copy_of(value)
                if copy != value:
                    node.input[slot] = copy
                    rewired += 1
        self._forward_without_context()
        return rewired

    def _first_value(self, i: int) -> int:
        """PythonOps' output 0 is their autograd context, which the backward must read as is; a recomputable
        PythonOp's backward reads its recomputed copy's."""
        node = self.view.nodes[i]
        return 1 if node.op_type == "PythonOp" and _not_recomputable(node) else 0

    def _forward_without_context(self) -> None:
        """A recomputable PythonOp whose backward now reads its copy's context runs in the forward without autograd
        (training_mode 0): nothing is kept for a backward that will not read it, and ORT holds no context."""
        for i in self.nodes:
            node = self.view.nodes[i]
            copied = self.copies.get(node.output[0], node.output[0]) != node.output[0]
            if node.op_type == "PythonOp" and copied and not _not_recomputable(node):
                for attribute in node.attribute:
                    if attribute.name == "training_mode":
                        attribute.i = 0

    def _copy_of(self, value: str) -> str:
        """The name of `value` recomputed after the anchor, or `value` itself where it cannot be recomputed. Depth
        first on a stack of `_copy_steps` frames, not Python's: a layer's forward can chain more ops than Python's
        recursion limit. A frame yields each value it needs copied first and is sent back that value's copy."""
        frames, result = [self._copy_steps(value)], None
        while frames:
            try:
                frames.append(self._copy_steps(frames[-1].send(result)))
                result = None
            except StopIteration as done:
                frames.pop()
                result = done.value
        return result

    def _copy_steps(self, value: str) -> Generator[str, str, str]:
        """One frame of `_copy_of`: copies `value` once the values it yields are copied."""
        if value in self.copies:
            return self.copies[value]
        i = self.view.producer.get(value)
        if i is None or (i not in self.nodes and i != self.pre):
            return value  # made outside the region (a constant, a mask): read as it is
        node = self.view.nodes[i]
        slot = list(node.output).index(value)
        name = function_name_of(node)
        if name == function_name(PreForwardBridge):
            key, input_count = ints_attribute(node, "input_int_scalars")[:2]
            if i == self.pre and slot <= input_count:
                copy = self._start_bridge(node, input_count).output[slot]
            elif slot <= input_count:
                copy = yield node.input[slot - 1]
            else:
                copy = (yield from self._params_bridge(key, node, input_count)).output[slot - input_count]
        elif name == function_name(PostForwardBridge):
            copy = yield node.input[slot - 1]
        elif reason := _not_recomputable(node) or self._reads_parameters_gathered_outside(node):
            self.kept.append(f"{self.path}: {value} ({reason})")
            copy = value
        else:
            copied = yield from self._copy_node(node)
            self.copies.update({out: new for out, new in zip(node.output, copied, strict=True) if out})
            copy = copied[slot]
        self.copies[value] = copy
        return copy

    def _reads_parameters_gathered_outside(self, node: onnx.NodeProto) -> str:
        """A torch kernel whose parameters another module gathers (a tied weight): a copy would read the forward's
        gathered copy, kept alive for it; the kernel keeps its own state instead."""
        if node.op_type != "PythonOp":
            return ""
        for value in node.input:
            producer = self.view.producer.get(value)
            if producer is None or producer == self.pre or producer in self.nodes:
                continue
            bridge = self.view.nodes[producer]
            if function_name_of(bridge) == function_name(PreForwardBridge):
                if list(bridge.output).index(value) > ints_attribute(bridge, "input_int_scalars")[1]:
                    return "it reads a parameter another module gathers"
        return ""

    def _copy_node(self, node: onnx.NodeProto) -> Generator[str, str, list[str]]:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = f"{node.name or node.op_type}{RECOMPUTE_SUFFIX}"
        for slot, value in enumerate(node.input):
            if value:
                copy.input[slot] = yield value
        entering = [slot for slot, value in enumerate(copy.input) if self._kept_python_output(value)]
        if entering and not any(value in self.anchored for value in copy.input):
            # Its inputs are forward values (a foreign PythonOp's output, kept): one enters through the start
            # bridge, or the copy would not wait for the backward.
            copy.input[entering[0]] = self._enter(copy.input[entering[0]])
        for slot, value in enumerate(node.output):
            if value:
                copy.output[slot] = f"{value}{RECOMPUTE_SUFFIX}"
        self.anchored.update(out for out in copy.output if out)
        self.new_nodes.append(copy)  # a Dropout keeps the forward's seed (`seed_dropouts`)
        return list(copy.output)

    def _start_bridge(self, pre: onnx.NodeProto, input_count: int) -> onnx.NodeProto:
        if self.start is None:
            anchor = self.view.nodes[self.anchor]
            after = next(slot for slot, out in enumerate(anchor.output) if out)
            ranks, types = ints_attribute(pre, "input_tensor_ranks"), ints_attribute(pre, "input_tensor_types")
            name = f"{START_PREFIX}_{self.key}"
            self.start = make_python_op(
                function_name(RecomputeStartBridge),
                name,
                int_scalars=[self.key],
                inputs=[
                    (anchor.output[after], *_output_type(anchor, after)),
                    *((pre.input[j], ranks[j], types[j]) for j in range(input_count)),
                ],
                outputs=[(f"{name}_{j}", ranks[j], types[j]) for j in range(input_count)],
                training_mode=0,
            )
            self.start.doc_string = f"{self.plan} {self.path}"
            self.anchored.update(self.start.output[1:])
            self.new_nodes.append(self.start)
        return self.start

    def _kept_python_output(self, value: str) -> bool:
        producer = self.view.producer.get(value)
        return producer is not None and self.view.nodes[producer].op_type == "PythonOp" and value not in self.anchored

    def _enter(self, value: str) -> str:
        """`value`, a forward value, passed through the start bridge (added to it as one more input)."""
        pre = self.view.nodes[self.pre]
        start = self._start_bridge(pre, ints_attribute(pre, "input_int_scalars")[1])
        producer = self.view.nodes[self.view.producer[value]]
        slot = list(producer.output).index(value)
        rank, elem_type = _output_type(producer, slot)
        name = f"{start.name}_{len(start.output) - 1}"
        start.input.append(value)
        start.output.append(name)
        for attribute, extra in (
            ("input_tensor_ranks", rank),
            ("input_tensor_types", elem_type),
            ("output_tensor_ranks", rank),
            ("output_tensor_types", elem_type),
        ):
            set_ints_attribute(start, attribute, [*ints_attribute(start, attribute), extra])
        for attribute in start.attribute:
            if attribute.name == "input_convention":
                attribute.s += b"d"
        self.anchored.add(name)
        return name

    def _params_bridge(self, key: int, pre: onnx.NodeProto, input_count: int) -> Generator[str, str, onnx.NodeProto]:
        if key not in self.param_bridges:
            params = zero3_state.lookup(key).bridged_params()
            if not input_count:  # a module called without tensors: gather when the region's recompute starts
                pre = self.view.nodes[self.pre]
                input_count = ints_attribute(pre, "input_int_scalars")[1]
            region_pre = self.view.nodes[self.pre]
            if input_count and (yield pre.output[1]) not in self.anchored:
                pre, input_count = region_pre, ints_attribute(region_pre, "input_int_scalars")[1]
                if input_count:
                    self._start_bridge(pre, input_count)
            if input_count:
                after = yield pre.output[1]
                rank, elem_type = (
                    ints_attribute(pre, "input_tensor_ranks")[0],
                    ints_attribute(pre, "input_tensor_types")[0],
                )
            else:
                anchor = self.view.nodes[self.anchor]
                slot = next(slot for slot, out in enumerate(anchor.output) if out)
                after, (rank, elem_type) = anchor.output[slot], _output_type(anchor, slot)
            name = f"ort_zero_recompute_params_{self.key}_{key}"
            self.param_bridges[key] = make_params_bridge(
                RecomputeParamsBridge, name, key, params, (after, rank, elem_type)
            )
            self.anchored.update(self.param_bridges[key].output[1:])
            self.new_nodes.append(self.param_bridges[key])
        return self.param_bridges[key]


def _readers_after(view: TrainingGraphView, anchor: int) -> set[int]:
    """The nodes that run after `anchor`: its descendants, and the nodes ORT's gradient graph computes from forward
    values alone (a Reshape of an activation for a weight gradient) whose every use is one of those."""
    after = view.closure([anchor], upward=False)
    floating = [i for i in reversed(view.order) if i not in view.forward and i not in view.backward_set]
    for i in floating:
        uses = [c for out in view.nodes[i].output if out for c in view.consumers.get(out, ())]
        if uses and all(c in after for c in uses):
            after.add(i)
    return after


def _output_type(node: onnx.NodeProto, slot: int) -> tuple[int, int]:
    """(rank, ONNX type) of a PythonOp(Grad)'s tensor output `slot` (output 0, the context, not counted)."""
    tensor_slot = slot - 1 if node.op_type == "PythonOp" else slot
    ranks, types = ints_attribute(node, "output_tensor_ranks"), ints_attribute(node, "output_tensor_types")
    return ranks[tensor_slot], types[tensor_slot]


def _not_recomputable(node: onnx.NodeProto) -> str:
    """Why `node` cannot run a second time in the backward ('' if it can)."""
    if node.op_type == "PythonOp" and function_name_of(node) in RECOMPUTABLE:
        return "it draws attention dropout" if draws_dropout(node) else ""
    if node.op_type in ("PythonOp", "YieldOp"):
        return f"{function_name_of(node) or node.op_type} runs Python"
    if node.op_type in _RANDOM:
        return f"{node.op_type} draws random numbers"
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return f"{node.op_type} has subgraphs"
    return ""
