"""A torch kernel that fails inside ORT's graph, said in one error. ORT prints a PythonOp's Python exception and
raises its own ("Non-zero status code returned while running PythonOp node ... Get null result"): the kernels
record their error, naming the layer from DeepSpeed's stack of running modules and the implementation to pick, and
the ORT step that failed raises that error instead (`raising_kernel_failure`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_RECORDED: list[RuntimeError] = []  # the last kernel failure, until the step raises it (one step runs at a time)


def kernel_failure(kernel: str, refused: str, error: BaseException, way_out: str) -> RuntimeError:
    """The error a kernel raises (and records for `raising_kernel_failure`)."""
    failure = RuntimeError(
        f"ort_zero: {kernel} in {_running_layer()}, run by torch inside ONNX Runtime's graph, failed on {refused}: "
        f"{str(error).strip()} -- {way_out}"
    )
    _RECORDED[:] = [failure]
    return failure


def _running_layer() -> str:
    """The innermost module DeepSpeed's hooks have running (the bridges keep the stack under ORT), by its path in the
    outermost module that holds it."""
    from ....foreign import deepspeed as ds_internals

    stack = ds_internals.forward_module_stack()
    if not stack:
        return "the model"
    module = stack[-1]
    for outer in stack:
        for path, inner in outer.named_modules():
            if inner is module:
                return f"'{path.removeprefix('_original_module.') or '<root>'}' ({type(module).__name__})"
    return f"a {type(module).__name__}"


def raising_kernel_failure(run: Callable[..., Any]) -> Callable[..., Any]:
    """The patch's factory for ORT's `TrainingAgent.run_forward`: a step whose failure a kernel recorded raises the
    kernel's error."""

    @functools.wraps(run)
    def run_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        _RECORDED.clear()
        try:
            return run(self, *args, **kwargs)
        except RuntimeError as ort_error:
            if _RECORDED:
                raise _RECORDED.pop() from ort_error
            raise

    return run_forward
