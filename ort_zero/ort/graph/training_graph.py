"""ORT's training graph as ort_zero's passes see it: producers, consumers, a stable topological order, and which
nodes belong to the forward (feed the YieldOp) or to the backward (follow it). Reading it changes nothing; a pass
writes its result back once, through `rebuild` (after which the view is stale)."""

from __future__ import annotations

import heapq
from collections import defaultdict

import onnx

from .pass_through import yield_op_of

# Ops whose output is the parameter seen differently (ORT may even alias the buffer): re-done in the backward.
VIEW_OPS = frozenset({"Transpose", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand"})
# Only computed from a parameter, never keeping it: re-done too when the backward reads them.
SHAPE_OPS = frozenset({"Shape", "Size"})


class TrainingGraphView:
    """Producers, consumers, a topological order, and which nodes are forward (feed the YieldOp) or backward; the
    one write is `rebuild`."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.nodes = list(graph.node)
        self.producer = {out: i for i, node in enumerate(self.nodes) for out in node.output if out}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for i, node in enumerate(self.nodes):
            for value in node.input:
                self.consumers[value].append(i)
        self.order = topological_order(self.nodes)
        self.position = {node: position for position, node in enumerate(self.order)}
        yield_node = yield_op_of(graph)
        if yield_node is None:
            raise ValueError("not a training graph: no YieldOp")
        yield_op = next(i for i, node in enumerate(self.nodes) if node is yield_node)
        self.forward = self.closure([yield_op], upward=True)
        self.not_forward = [i for i in self.order if i not in self.forward]
        backward = self.closure([yield_op], upward=False) - {yield_op}
        self.backward = [i for i in self.order if i in backward]
        self.backward_set = backward

    def inputs_of(self, i: int) -> list[int]:
        return [self.producer[v] for v in self.nodes[i].input if v in self.producer]

    def anchor_ancestry(self, anchors: list[int]) -> dict[int, int]:
        """Per node, a bit mask over node indices of the anchors it depends on (itself included)."""
        anchor_set, masks = set(anchors), {}
        for i in self.order:
            mask = 1 << i if i in anchor_set else 0
            for producer in self.inputs_of(i):
                mask |= masks[producer]
            masks[i] = mask
        return masks

    def rebuild(self, new_nodes: list[onnx.NodeProto]) -> None:
        """Add `new_nodes`, drop views left without a use, write the graph back in topological order."""
        nodes = self.nodes + new_nodes
        used = {value for node in nodes for value in node.input} | {out.name for out in self.graph.output}
        changed = True
        while changed:  # a view of a forward copy, now unread, goes; then what only it read
            changed = False
            for node in list(nodes):
                if node.op_type in VIEW_OPS | SHAPE_OPS and not any(out in used for out in node.output):
                    nodes.remove(node)
                    used = {value for n in nodes for value in n.input} | {out.name for out in self.graph.output}
                    changed = True
        del self.graph.node[:]
        self.graph.node.extend(topologically_sorted(nodes))

    def closure(self, start: list[int], upward: bool) -> set[int]:
        seen, stack = set(start), list(start)
        while stack:
            i = stack.pop()
            if upward:
                following = self.inputs_of(i)
            else:
                following = [c for out in self.nodes[i].output if out for c in self.consumers.get(out, ())]
            for j in following:
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        return seen


def topological_order(nodes: list[onnx.NodeProto]) -> list[int]:
    """Indices of `nodes` in a topological order that keeps the given order where it can."""
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    waiting = [sum(1 for v in set(node.input) if v in producer) for node in nodes]
    consumers: dict[int, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for v in set(node.input):
            if v in producer:
                consumers[producer[v]].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in consumers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise ValueError("the training graph has a cycle")
    return order


def topologically_sorted(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    return [nodes[i] for i in topological_order(nodes)]


def bits(mask: int) -> list[int]:
    bits = []
    while mask:
        low = mask & -mask
        bits.append(low.bit_length() - 1)
        mask ^= low
    return bits
