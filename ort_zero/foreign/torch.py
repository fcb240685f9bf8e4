"""torch's internals that ort_zero reads (torch `versions.TORCH_VERSIONS`).

Read: `torch._C._construct_storage_from_data_pointer` (a storage over memory it does not own),
`torch._C._storage_Use_Count` (who else holds a storage: the linear layers' output pool), a module's
`_backward_hooks`, a tensor's `_backward_hooks` and `_post_accumulate_grad_hooks` (what AccumulateGrad runs),
TorchScript's `torch._C.TupleType` (an exported graph's tuple values: export_tuples) and `torch._C.TensorType` (a
graph value's dtype, which promotion_casts also retypes), the TorchScript exporter's
symbolic helpers `_is_none`, `_get_const`, `_unpack_list` and `_type_utils` (export_overrides, export_einsum), and
the private module `torch.utils._pytree` (the nested-structure walker FSDP2 uses too). The exporter's private
modules ORTModule imports are `ort_zero.patches`' (torch_onnx group).

Read and written: the TorchScript tracer's source-location callback (`tracer_recorder`, `set_tracer_recorder`), read
from the code of the two functions libtorch exports around it.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree  # noqa: F401  (re-exported: ort_zero.hooks.nested walks with it)


def unowned_storage(data_ptr: int, device: torch.device, nbytes: int) -> torch.UntypedStorage:
    """A storage over `nbytes` at `data_ptr` that does not keep the memory alive."""
    return torch._C._construct_storage_from_data_pointer(data_ptr, device, nbytes)


def storage_object_use_count(storage: torch.UntypedStorage) -> int:
    """The references to the storage behind a storage object: its tensors and views, and each such object (one for
    `storage` itself)."""
    return torch._C._storage_Use_Count(storage._cdata)


def full_backward_hooks(module: torch.nn.Module) -> list[Callable[..., Any]]:
    """The backward hooks registered on `module` (`register_full_backward_hook`)."""
    return list(module._backward_hooks.values())


def tensor_grad_hooks(tensor: torch.Tensor) -> list[Callable[..., Any]]:
    """The hooks `tensor.register_hook` added: AccumulateGrad runs them on a gradient before accumulating it."""
    return list((tensor._backward_hooks or {}).values())


def post_accumulate_grad_hooks(tensor: torch.Tensor) -> list[Callable[..., Any]]:
    """The hooks `tensor.register_post_accumulate_grad_hook` added, in order (AccumulateGrad runs them last)."""
    return list((getattr(tensor, "_post_accumulate_grad_hooks", None) or {}).values())


def jit_value_scalar_type(value: Any) -> str | None:
    """The scalar type a TorchScript graph value is typed with (torch's name: "Float", "ComplexDouble"); None where
    it is no tensor or has none."""
    typed = value.type()
    return typed.scalarType() if isinstance(typed, torch._C.TensorType) else None


def set_jit_value_dtype(value: Any, dtype: torch.dtype) -> None:
    value.setType(value.type().with_dtype(dtype))


def onnx_is_none(value: Any) -> bool:
    """In a TorchScript ONNX symbolic: whether an optional input was not given (e.g. a LayerNorm without weight)."""
    from torch.onnx import symbolic_helper

    return symbolic_helper._is_none(value)


def onnx_constant_ints(value: Any, name: str) -> list[int]:
    """In a TorchScript ONNX symbolic: a constant int-list input's values (e.g. a LayerNorm's normalized shape)."""
    from torch.onnx import symbolic_helper

    return symbolic_helper._get_const(value, "is", name)


def onnx_constant_int(value: Any, name: str) -> int:
    """In a TorchScript ONNX symbolic: a constant int input's value (e.g. diff's dim)."""
    from torch.onnx import symbolic_helper

    return symbolic_helper._get_const(value, "i", name)


def onnx_rank(value: Any) -> int | None:
    """In a TorchScript ONNX symbolic: how many dimensions a value has, where the exporter knows it."""
    from torch.onnx import symbolic_helper

    return symbolic_helper._get_tensor_rank(value)


def onnx_dtype(value: Any) -> torch.dtype:
    """In a TorchScript ONNX symbolic: the dtype of a value the exporter knows (float32 where it does not)."""
    from torch.onnx import _type_utils

    return _type_utils.JitScalarType.from_value(value, _type_utils.JitScalarType.FLOAT).dtype()


def onnx_constant_float(value: Any, name: str) -> float:
    """In a TorchScript ONNX symbolic: a constant float input's value (e.g. softplus's beta)."""
    from torch.onnx import symbolic_helper

    return symbolic_helper._get_const(value, "f", name)


def onnx_constant_string(value: Any, name: str) -> str:
    """In a TorchScript ONNX symbolic: a constant string input's value (e.g. einsum's equation)."""
    from torch.onnx import symbolic_helper

    return symbolic_helper._get_const(value, "s", name)


def onnx_list(value: Any) -> list[Any]:
    """In a TorchScript ONNX symbolic: the values of a list input (e.g. einsum's operands)."""
    from torch.onnx import symbolic_helper

    return symbolic_helper._unpack_list(value)


def jit_tuple_elements(value: Any) -> list[Any] | None:
    """The element types of a TorchScript graph value of tuple type; None when it is no tuple."""
    value_type = value.type()
    return list(value_type.elements()) if isinstance(value_type, torch._C.TupleType) else None


# torch::jit::tracer::setRecordSourceLocation(void (*)(Node*)) and recordSourceLocation(Node*), as libtorch exports them
_SET_RECORDER = "_ZN5torch3jit6tracer23setRecordSourceLocationEPFvPNS0_4NodeEE"
_RECORD = "_ZN5torch3jit6tracer20recordSourceLocationEPNS0_4NodeE"


def tracer_recorder() -> int | None:
    """The address of the callback torch's tracer calls on every node it traces to record its source range (torch's
    own walks the Python stack); None where it cannot be read."""
    slot = _recorder_slot()
    return None if slot is None else ctypes.c_void_p.from_address(slot[0]).value


def set_tracer_recorder(address: int) -> None:
    """Make the tracer call the C function at `address` (`void (torch::jit::Node*)`) for each node's source range."""
    slot = _recorder_slot()
    if slot is None:
        raise RuntimeError("torch's tracer callback cannot be read on this platform: check tracer_recorder() first")
    slot[1](address)


@functools.cache
def _recorder_slot() -> tuple[int, Any] | None:
    """Where libtorch keeps the tracer's source-location callback, and its setter; None where it cannot be read.

    torch has no getter. The slot is read from the two exported functions that use it: `recordSourceLocation` loads
    it (`mov rax, [rip+d]; jmp rax`) and `setRecordSourceLocation` stores it (`xchg [rip+d], rdi; ret`); both must
    name the same address (x86-64 Linux builds of torch 2.14-2.15)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        set_recorder, record = getattr(library, _SET_RECORDER), getattr(library, _RECORD)
    except (OSError, AttributeError):
        return None
    loads = _rip_relative(record, prefix=b"\x48\x8b\x05", suffix=b"\xff\xe0")
    stores = _rip_relative(set_recorder, prefix=b"\x48\x87\x3d", suffix=b"\xc3")
    if loads is None or loads != stores:
        return None
    set_recorder.argtypes, set_recorder.restype = [ctypes.c_void_p], None
    return loads, set_recorder


def _rip_relative(function: Any, prefix: bytes, suffix: bytes) -> int | None:
    """The address a function's single instruction `prefix disp32` reads or writes, if its code is exactly that
    instruction followed by `suffix`."""
    start = ctypes.cast(function, ctypes.c_void_p).value
    code = ctypes.string_at(start, len(prefix) + 4 + len(suffix))
    if not code.startswith(prefix) or not code.endswith(suffix):
        return None
    displacement = int.from_bytes(code[len(prefix) : len(prefix) + 4], "little", signed=True)
    return start + len(prefix) + 4 + displacement
