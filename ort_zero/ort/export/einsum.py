"""How ort_zero exports `torch.einsum`: as ONNX ops ORT 1.19.2 differentiates (MatMul, Transpose, Reshape, ReduceSum,
Mul), never as an Einsum node, which ORT has no gradient builder for.

ORTModule's own einsum symbolic already writes a two-operand equation with an explicit output and no ellipsis as a
batched MatMul between Transposes and Reshapes; every other equation it leaves as Einsum. This override brings each
equation to that form first: the ellipsis becomes letters (the operands' ranks are known at export), an implicit
output is made explicit, three or more operands are contracted two at a time (keeping the labels later operands or
the output need), and a single operand is a ReduceSum over the labels the output drops, then a Transpose. An equation
neither can write without Einsum (a label repeated within one operand, a diagonal; an empty output of two operands)
keeps ORT's export.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...foreign import torch as torch_internals

_SPARE_LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _normalized(equation: str, ranks: list[int | None]) -> tuple[list[str], str] | None:
    """The operands' labels and the output's, without ellipsis and with an explicit output (None where a rank the
    ellipsis needs is unknown)."""
    equation = equation.replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    operands = inputs.split(",")
    if "..." in equation:
        spare = [label for label in _SPARE_LABELS if label not in equation]
        widths = []
        for operand, rank in zip(operands, ranks, strict=True):
            if "..." in operand:
                if rank is None:
                    return None
                widths.append(rank - len(operand.replace("...", "")))
        width = max(widths, default=0)
        ellipsis = "".join(spare[:width])
        operands = [
            operand.replace("...", ellipsis[width - (rank - len(operand.replace("...", ""))) :])
            if "..." in operand
            else operand
            for operand, rank in zip(operands, ranks, strict=True)
        ]
        output = output.replace("...", ellipsis) if arrow else ellipsis + output
    if not arrow:  # torch's implicit output: the labels that appear once, in alphabetical order
        counts = "".join(operands)
        output += "".join(sorted(label for label in set(counts) if counts.count(label) == 1 and label not in output))
    return operands, output


def _single(g: Any, tensor: Any, labels: str, output: str) -> Any:
    """One operand: a sum over the labels the output drops, then the output's order."""
    dropped = [axis for axis, label in enumerate(labels) if label not in output]
    if dropped:
        axes = g.op("Constant", value_t=torch.tensor(dropped, dtype=torch.int64))
        tensor = g.op("ReduceSum", tensor, axes, keepdims_i=0)
        labels = "".join(label for label in labels if label in output)
    perm = [labels.index(label) for label in output]
    return g.op("Transpose", tensor, perm_i=perm) if perm != list(range(len(perm))) else tensor


def einsum_symbolic(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def einsum(g: Any, equation: Any, tensor_list: Any, path: Any = None) -> Any:
        tensors = torch_internals.onnx_list(tensor_list)
        text = torch_internals.onnx_constant_string(equation, "equation")
        normalized = _normalized(text, [torch_internals.onnx_rank(t) for t in tensors])
        if normalized is None or any(len(set(labels)) != len(labels) for labels in normalized[0]):
            return ort_symbolic(g, equation, tensor_list, path)  # an Einsum node, as before
        operands, output = normalized
        if len(operands) == 1:
            return _single(g, tensors[0], operands[0], output)

        def pair(first: Any, second: Any, labels: str) -> Any:
            # ORTModule's two-operand symbolic (batched MatMul), handed a list of its own
            return ort_symbolic(g, labels, g.op("prim::ListConstruct", first, second), None)

        result, labels = tensors[0], operands[0]
        for k in range(1, len(operands)):
            needed = set(output).union(*operands[k + 1 :])
            kept = "".join(dict.fromkeys(label for label in labels + operands[k] if label in needed))
            target = output if k == len(operands) - 1 else kept
            if not target:  # a full contraction: ORTModule's symbolic needs an output label
                return ort_symbolic(g, equation, tensor_list, path)
            result, labels = pair(result, tensors[k], f"{labels},{operands[k]}->{target}"), target
        return result

    return einsum
