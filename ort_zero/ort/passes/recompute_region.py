"""One region of the layer-wise recompute: its forward nodes, its anchor, and the copies that recompute what its
backward reads (`recompute.py` chooses the regions and applies them)."""

from __future__ import annotations

from collections.abc import Generator

import onnx
import torch

from ...python_op import PYTHON_OP, PYTHON_OP_GRAD, context_of, first_output, function_name_of, output_type
from ...zero3 import state as zero3_state
from ...zero3.bridge_nodes import BridgeNode
from ...zero3.bridges import PostForwardBridge, PreForwardBridge, StepStartBridge
from ...zero3.ort_bridges import RecomputeParamsBridge
from ..graph.training_graph import TrainingGraphView
from ..step.torch_kernels import RECOMPUTABLE, draws_dropout

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
        for i in view.forward:
            node = view.nodes[i]
            for bridge, calls in ((PreForwardBridge, self.pre), (PostForwardBridge, self.post)):
                if (call := BridgeNode.of(node, bridge)) is not None:
                    calls.setdefault(call.key, []).append(i)
            if (start := BridgeNode.of(node, StepStartBridge)) is not None:
                self.step_start_key = start.key
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
        ctx = context_of(view.nodes[self.post])
        self.anchor = next((c for c in view.consumers.get(ctx, ()) if view.nodes[c].op_type == PYTHON_OP_GRAD), None)
        if self.anchor is None:
            self.skip_reason = "no gradient flows through it"
            return
        inside = view.closure([self.pre], upward=False) & view.closure([self.post], upward=True)
        self.nodes = (inside & view.forward) - {self.pre, self.post}
        self.readers = _readers_after(view, self.anchor)
        self.copies: dict[str, str] = {}
        self.param_bridges: dict[int, BridgeNode] = {}
        self.start: BridgeNode | None = None
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
        return 1 if node.op_type == PYTHON_OP and _not_recomputable(node) else 0

    def _forward_without_context(self) -> None:
        """A recomputable PythonOp whose backward now reads its copy's context runs in the forward without autograd
        (training_mode 0): nothing is kept for a backward that will not read it, and ORT holds no context."""
        for i in self.nodes:
            node = self.view.nodes[i]
            copied = self.copies.get(node.output[0], node.output[0]) != node.output[0]
            if node.op_type == PYTHON_OP and copied and not _not_recomputable(node):
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
        if (pre := BridgeNode.of(node, PreForwardBridge)) is not None:
            passed, param = pre.passed_input(value), pre.param_index(value)
            if param is not None:
                copy = (yield from self._params_bridge(pre)).outputs[param]
            elif i == self.pre:
                copy = self._start_bridge().outputs[pre.passed_outputs.index(value)]
            else:
                copy = yield passed
        elif (post := BridgeNode.of(node, PostForwardBridge)) is not None:
            copy = yield post.passed_input(value)
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
        if node.op_type != PYTHON_OP:
            return ""
        for value in node.input:
            producer = self.view.producer.get(value)
            if producer is None or producer == self.pre or producer in self.nodes:
                continue
            bridge = BridgeNode.of(self.view.nodes[producer], PreForwardBridge)
            if bridge is not None and bridge.param_index(value) is not None:
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

    def _start_bridge(self) -> BridgeNode:
        """The region's RecomputeStartBridge: the region module's inputs, copied once the anchor has run."""
        if self.start is None:
            name = f"{START_PREFIX}_{self.key}"
            pre = BridgeNode(self.view.nodes[self.pre], PreForwardBridge)
            after = first_output(self.view.nodes[self.anchor])
            self.start = BridgeNode.recompute_start(name, self.key, after, pre.passed_inputs_typed())
            self.start.node.doc_string = f"{self.plan} {self.path}"
            self.anchored.update(self.start.outputs)
            self.new_nodes.append(self.start.node)
        return self.start

    def _kept_python_output(self, value: str) -> bool:
        producer = self.view.producer.get(value)
        return producer is not None and self.view.nodes[producer].op_type == PYTHON_OP and value not in self.anchored

    def _enter(self, value: str) -> str:
        """`value`, a forward value, passed through the start bridge (added to it as one more input)."""
        producer = self.view.nodes[self.view.producer[value]]
        name = self._start_bridge().pass_another((value, *output_type(producer, list(producer.output).index(value))))
        self.anchored.add(name)
        return name

    def _params_bridge(self, pre: BridgeNode) -> Generator[str, str, BridgeNode]:
        """The RecomputeParamsBridge of `pre`'s module: its parameters, gathered once the recompute reaches the
        module's first input (or, where that is not recomputed, once the region's recompute starts)."""
        key = pre.key
        if key not in self.param_bridges:
            params = zero3_state.lookup(key).bridged_params()
            region_pre = BridgeNode(self.view.nodes[self.pre], PreForwardBridge)
            if not pre.input_count:  # a module called without tensors: gather when the region's recompute starts
                pre = region_pre
            if pre.input_count and (yield pre.passed_outputs[0]) not in self.anchored:
                pre = region_pre
                if pre.input_count:
                    self._start_bridge()
            if pre.input_count:
                after = ((yield pre.passed_outputs[0]), *pre.input_type(0))
            else:
                after = first_output(self.view.nodes[self.anchor])
            name = f"ort_zero_recompute_params_{self.key}_{key}"
            bridge = BridgeNode.params_bridge(RecomputeParamsBridge, name, key, params, after)
            self.anchored.update(bridge.outputs)
            self.new_nodes.append(bridge.node)
            self.param_bridges[key] = bridge
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


def _not_recomputable(node: onnx.NodeProto) -> str:
    """Why `node` cannot run a second time in the backward ('' if it can)."""
    if node.op_type == PYTHON_OP and function_name_of(node) in RECOMPUTABLE:
        return "it draws attention dropout" if draws_dropout(node) else ""
    if node.op_type in (PYTHON_OP, "YieldOp"):
        return f"{function_name_of(node) or node.op_type} runs Python"
    if node.op_type in _RANDOM:
        return f"{node.op_type} draws random numbers"
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return f"{node.op_type} has subgraphs"
    return ""
