"""ort_zero's changes to the sources of ORTModule's torch C++ extensions, applied to the build's scratch copy.

onnxruntime-training 1.19.2 ships the C++ sources of `torch_interop_utils` (how ORT runs PythonOps) and
`aten_op_executor`, compiled on the user's machine against the installed torch. They were written for torch <= 2.6;
newer torch hides two symbols they use and reshapes three types. Each edit below says what it changes, why, and from
which torch version it is needed; the build refuses a torch outside `TORCH_VERSIONS` and any edit that no longer
finds the text it replaces, so a changed ORT or torch fails at build time with the edit's name, never at run time.
The wheel's own files are never modified.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..foreign.versions import TORCH_VERSIONS

ORT_VERSION = "1.19.2"

# Torch >= 2.7 keeps PyNode's typeinfo and tensor_fromDLPack out of libtorch_python's exported symbols: these
# replacements need neither (a type test on the mangled name, and libtorch's exported at::fromDLPack).
_COMPAT_HELPERS = """
#include <ATen/DLConvertor.h>
#include <torch/csrc/autograd/python_function.h>
#include <cstdlib>
#include <cstring>
#include <typeinfo>

// ort_zero: the dynamic type of a Node, told without PyNode's typeinfo symbol (not exported from torch 2.7).
inline torch::autograd::PyNode* ort_zero_as_py_node(torch::autograd::Node* node) {
  if (node == nullptr || std::strcmp(typeid(*node).name(), "N5torch8autograd6PyNodeE") != 0) return nullptr;
  return static_cast<torch::autograd::PyNode*>(node);
}

// ort_zero: a tensor over a DLPack capsule's memory, freed through the producer's deleter (ORT's releases an
// OrtValue: C++ only, so no GIL is taken; a deleter taking the GIL on another thread while Python finalizes ends the
// process with std::terminate). Replaces torch::utils::tensor_fromDLPack (not exported from torch 2.7).
inline at::Tensor ort_zero_tensor_from_dlpack(PyObject* capsule) {
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  TORCH_CHECK(managed != nullptr, "ort_zero: a PythonOp argument is not an unused DLPack capsule");
  at::Tensor tensor = at::fromDLPack(managed);
  PyCapsule_SetName(capsule, "used_dltensor");  // the tensor owns the memory now; the capsule must not free it
  return tensor;
}
"""


@dataclass(frozen=True)
class SourceEdit:
    """Replace `find` by `replace` in one file of an extension, exactly `count` times."""

    name: str
    path: str  # relative to torch_cpp_extensions/
    find: str
    replace: str
    since_torch: str
    reason: str
    count: int = 1


_INTEROP = "cpu/torch_interop_utils"
EDITS: tuple[SourceEdit, ...] = (
    SourceEdit(
        "compat helpers",
        f"{_INTEROP}/custom_function_shared.h",
        "#include <torch/extension.h>\n",
        "#include <torch/extension.h>\n" + _COMPAT_HELPERS,
        "2.7",
        "the two helpers below stand in for symbols torch stopped exporting",
    ),
    SourceEdit(
        "PyNode type test",
        f"{_INTEROP}/custom_function_fw.cc",
        "dynamic_cast<torch::autograd::PyNode*>(",
        "ort_zero_as_py_node(",
        "2.7",
        "dynamic_cast<PyNode*> needs typeinfo for PyNode: `undefined symbol: _ZTIN5torch8autograd6PyNodeE` at import",
        count=2,
    ),
    SourceEdit(
        "DLPack in forward",
        f"{_INTEROP}/custom_function_fw.cc",
        "torch::utils::tensor_fromDLPack(",
        "ort_zero_tensor_from_dlpack(",
        "2.7",
        "torch::utils::tensor_fromDLPack is no longer exported by libtorch_python",
    ),
    SourceEdit(
        "DLPack in backward",
        f"{_INTEROP}/custom_function_bw.cc",
        "torch::utils::tensor_fromDLPack(",
        "ort_zero_tensor_from_dlpack(",
        "2.7",
        "torch::utils::tensor_fromDLPack is no longer exported by libtorch_python",
    ),
    SourceEdit(
        "PyNode's Python object",
        f"{_INTEROP}/custom_function_fw.cc",
        "py_node_fn->obj;",
        "py_node_fn->pyobj();",
        "2.13",
        "PyNode::obj became PyNode::pyobj() (before 2.13 Node::pyobj() exists too but is another object)",
        count=2,
    ),
    SourceEdit(
        "grad_fn is intrusive",
        f"{_INTEROP}/custom_function_fw.cc",
        "const std::shared_ptr<torch::autograd::Node>& cdata =",
        "const auto& cdata =",
        "2.13",
        "Tensor::grad_fn() returns a c10::intrusive_ptr<Node>",
    ),
    SourceEdit(
        "THPFunction owns cdata",
        f"{_INTEROP}/custom_function_fw.cc",
        "auto saved_for = py_fn->cdata.lock();",
        "auto saved_for = py_fn->cdata;",
        "2.13",
        "THPFunction::cdata is an owning intrusive_ptr<Node>, no longer a weak_ptr",
    ),
    SourceEdit(
        "pooled grad_fns are intrusive",
        f"{_INTEROP}/ctx_pool.h",
        "std::unordered_map<size_t, std::shared_ptr<torch::autograd::Node>> grad_fns_;",
        "std::unordered_map<size_t, c10::intrusive_ptr<torch::autograd::Node>> grad_fns_;",
        "2.13",
        "AutogradMeta::grad_fn_, moved into the pool, is a c10::intrusive_ptr<Node>",
    ),
    SourceEdit(
        "emptyCache takes a pool",
        "cuda/torch_gpu_allocator/torch_gpu_allocator.cc",
        "  return reinterpret_cast<size_t>(&c10::cuda::CUDACachingAllocator::emptyCache);",
        "  // ort_zero: ORT calls this address with no argument; emptyCache takes a MempoolId_t from torch 2.8.\n"
        "  static void (*empty_all)() = [] { c10::cuda::CUDACachingAllocator::emptyCache(); };\n"
        "  return reinterpret_cast<size_t>(empty_all);",
        "2.8",
        "CUDACachingAllocator::emptyCache(MempoolId_t) called through ORT's argument-less pointer would read a "
        "garbage pool id",
    ),
    SourceEdit(
        "quiet first PythonOp run (forward)",
        f"{_INTEROP}/custom_function_fw.cc",
        '      std::cerr << "First-time run initialize kernel info including materialize_grads and '
        'materialize_grads_config."\n                << std::endl;\n',
        "",
        "2.0",
        "every rank printed this note to stderr at its first PythonOp: nothing a user can act on",
    ),
    SourceEdit(
        "quiet first PythonOp run (saved tensors)",
        f"{_INTEROP}/custom_function_fw.cc",
        '        std::cerr << "First time run initialize kernel info including saved_for_forward, and mark_dirty '
        'infos." << std::endl;\n',
        "",
        "2.0",
        "every rank printed this note to stderr at its first PythonOp: nothing a user can act on",
    ),
    SourceEdit(
        "quiet clone of an undeclared alias",
        f"{_INTEROP}/custom_function_shared.cc",
        '      std::cout << log_prefix << "ONNX Op attribute "\n',
        '      if (std::getenv("ORT_ZERO_SHOW_PYTHONOP_CLONES") != nullptr)\n'
        '      std::cout << log_prefix << "ONNX Op attribute "\n',
        "2.0",
        "ORT gives a PythonOp of an inference graph no alias maps, so an output that is a view of its input is "
        "cloned (as it should be) and every rank printed a line per PythonOp saying so; the line stays available "
        "with ORT_ZERO_SHOW_PYTHONOP_CLONES set (the tests that check which PythonOps ORT copies read it)",
    ),
    SourceEdit(
        "C++20",
        f"{_INTEROP}/setup.py",
        '"-std=c++17"',
        '"-std=c++20"',
        "2.13",
        "torch's headers use C++20 features",
    ),
)


class SourceEditError(RuntimeError):
    """An edit no longer matches the sources it was written for."""


def check_torch(torch_version: str) -> None:
    release = Version(Version(torch_version).base_version)
    if release not in SpecifierSet(TORCH_VERSIONS):
        raise SourceEditError(
            f"ORTModule's torch extensions are built with ort_zero's source edits for torch{TORCH_VERSIONS}, and "
            f"torch {torch_version} is installed; install one of those (launch/bootstrap.sh: launch/constraints.txt)"
        )


def edits_for(extension_path: str, torch_version: str) -> list[SourceEdit]:
    release = Version(Version(torch_version).base_version)
    return [
        edit for edit in EDITS if edit.path.startswith(extension_path + "/") and release >= Version(edit.since_torch)
    ]


def apply(root: Path, extension_path: str, torch_version: str) -> list[str]:
    """Edit the scratch copy of one extension (`root` = torch_cpp_extensions/ copy); returns the edits' names."""
    check_torch(torch_version)
    applied = []
    for edit in edits_for(extension_path, torch_version):
        source = root / edit.path
        text = source.read_text()
        found = text.count(edit.find)
        if found != edit.count:
            raise SourceEditError(
                f"ort_zero's edit '{edit.name}' expects {edit.count} occurrence(s) of {edit.find!r} in {edit.path} "
                f"of onnxruntime-training {ORT_VERSION} and found {found}: the sources differ from those it was "
                "written for"
            )
        source.write_text(text.replace(edit.find, edit.replace))
        applied.append(edit.name)
    return applied
