"""The one registry of symbols ort_zero replaces in DeepSpeed and ONNX Runtime.

Every monkey patch in the package is declared here with what it replaces, why, and for which versions. The only
other code in ort_zero that reads another package's private names or writes into its objects is `ort_zero.foreign`,
one module per package (tests/unit/foreign checks that nothing else reaches). How patches are applied and reverted
(by name, in groups, restoring the original object exactly) is `ort_zero.patching`; its API is used through this
module.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

from .foreign import deepspeed as ds_internals
from .foreign.fingerprints import TESTED_SOURCES
from .foreign.versions import DEEPSPEED_VERSIONS, ORT_VERSIONS, TORCH_VERSIONS, TRANSFORMERS_VERSIONS, TRL_VERSIONS
from .ort import (
    console,
    export_autograd,
    export_context,
    export_python_ops,
    export_rewrites,
    export_tuples,
    output_structures,
    shape_inference,
    torch_compat,
    torch_kernels,
)
from .patching import (  # noqa: F401  (the registry's API, used as ort_zero.patches.*)
    Patch,
    UnsupportedVersionError,
    applied,
    apply_group,
    fingerprint,
    is_applied,
    original,
    register,
    registered,
    revert_group,
)
from .stack.cuda_provider import cuda_provider_required

# ---------------------------------------------------------------------------------------------------------------------
# The declarations. Factories whose code needs DeepSpeed or ONNX Runtime are `_deferred`: importing this module imports
# neither. Every factory is referenced by its name in code, never looked up by a string, and
# tests/unit/test_patches.py builds every replacement against the installed stack, so a rename fails there.


def _deferred(load: Callable[[], Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """A replacement factory imported when its patch applies: `load` returns it."""

    def make(replaced: Any) -> Any:
        return load()(replaced)

    return make


def _integration() -> Any:
    from .ort import integration

    return integration


def _export_overrides() -> Any:
    from .ort import export_overrides

    return export_overrides


def _checkpointing() -> Any:
    from .zero3 import checkpointing

    return checkpointing


def _torch(group: str, name: str, owner: str, attribute: str, reason: str, factory: Any, adds: bool = False) -> None:
    register(Patch(name, owner, attribute, "torch", TORCH_VERSIONS, reason, factory, adds=adds), group)


def _deepspeed(group: str, name: str, owner: str, attribute: str, reason: str, factory: Any) -> None:
    register(Patch(name, owner, attribute, "deepspeed", DEEPSPEED_VERSIONS, reason, factory), group)


def _transformers(
    group: str, name: str, owner: str, attribute: str, reason: str, factory: Any, family: tuple[str, ...]
) -> None:
    """A patch of transformers' model code: outside the tested versions it applies where that code is unchanged."""
    register(
        Patch(
            name, owner, attribute, "transformers", TRANSFORMERS_VERSIONS, reason, factory,
            fingerprints=TESTED_SOURCES.get(name, ()), family=", ".join(family),
        ),
        group,
    )  # fmt: skip


def _ort(group: str, name: str, owner: str, attribute: str, reason: str, factory: Any) -> None:
    register(Patch(name, owner, attribute, "onnxruntime-training", ORT_VERSIONS, reason, factory), group)


_ORTM = "onnxruntime.training.ortmodule"
_GTM = f"{_ORTM}._graph_transition_manager"
_GEM = f"{_ORTM}._graph_execution_manager:GraphExecutionManager"
_IO = f"{_ORTM}._io"


# ORTModule 1.19.2 on today's torch: applied when ort_zero is imported, since ORTModule cannot even be imported
# without them (users import it right after ort_zero). They touch torch only. Why: ort_zero/ort/torch_compat.py.
_TS_MOVED = "torch >= 2.9 moved the TorchScript exporter's private modules under torch.onnx._internal." + (
    "torchscript_exporter; ORTModule imports them from the old place"
)
for _name, _owner, _attribute, _replacement in [
    ("torch.onnx.jit_utils", "torch.onnx._internal", "jit_utils", torch_compat.moved_module("jit_utils")),
    ("torch.onnx._globals", "torch.onnx", "_globals", torch_compat.moved_module("_globals")),
    ("torch.onnx._type_utils", "torch.onnx", "_type_utils", torch_compat.moved_module("_type_utils")),
    ("torch.onnx.symbolic_opset9._convolution", "torch.onnx.symbolic_opset9", "_convolution",
     torch_compat.moved_function("symbolic_opset9", "_convolution")),
    ("torch.onnx.symbolic_opset9._convolution_mode", "torch.onnx.symbolic_opset9", "_convolution_mode",
     torch_compat.moved_function("symbolic_opset9", "_convolution_mode")),
]:  # fmt: skip
    _torch("torch_onnx", _name, _owner, _attribute, _TS_MOVED, _replacement, adds=True)
_torch(
    "torch_onnx", "torch.onnx.export_for_ort", "torch.onnx", "export",
    "torch >= 2.9 exports with dynamo by default, which makes no PythonOps, and ORT does not pass dynamo=False: called "
    "from ONNX Runtime's own modules, dynamo is off unless asked for; every other caller keeps torch's default.",
    torch_compat.torchscript_export_for_ort,
)  # fmt: skip


def _zero3_setup_hooks(_deepspeeds: Any) -> Any:
    from .zero3.install import setup_zero_stage3_hooks

    return setup_zero_stage3_hooks


_deepspeed(
    "zero3", "deepspeed.setup_zero_stage3_hooks", "deepspeed.runtime.zero.parameter_offload:DeepSpeedZeRoOffload",
    "setup_zero_stage3_hooks",
    "ZeRO-3's gathers and releases must run through autograd-Function bridges (PythonOps under ORT) instead of "
    "DeepSpeed's per-module closures, which ORT cannot tell apart and which run collectives while tracing.",
    _zero3_setup_hooks,
)  # fmt: skip


def _zero3_reduce_scatter(reduce_scatter: Any) -> Any:
    from .zero3.gloo_reduce_scatter import in_place_on_gloo

    return in_place_on_gloo(reduce_scatter)


_deepspeed(
    "zero3", "deepspeed.reduce_scatter_in_place_on_gloo", "deepspeed.runtime.comm.coalesced_collectives",
    "_torch_reduce_scatter_fn",
    "on gloo torch's reduce-scatter works on a fresh buffer the size of its whole input, every call; DeepSpeed's "
    "gradient reduce-scatter gives it scratch whose own chunk is the output, so an all-reduce in place gives the "
    "same values without that buffer (zero3/gloo_reduce_scatter.py).",
    _zero3_reduce_scatter,
)  # fmt: skip


def _zero3_save_checkpoint(save_checkpoint: Any) -> Any:
    from .zero3.saving import save_checkpoint_latest_last

    return save_checkpoint_latest_last(save_checkpoint)


_deepspeed(
    "zero3", "deepspeed.save_checkpoint_latest_last", "deepspeed.runtime.engine:DeepSpeedEngine", "save_checkpoint",
    "DeepSpeed's rank 0 writes the `latest` tag before the other ranks have finished writing their shards: a rank "
    "lost mid-save leaves `latest` naming a half-written checkpoint. Written after every rank's files, atomically.",
    _zero3_save_checkpoint,
)  # fmt: skip


@contextlib.contextmanager
def _during_export(module: Any) -> Iterator[None]:
    """What the replacements that run around a ZeRO-3 export enter: the "ort_export" group, the torch ops that run
    in PyTorch from the ORT graph (export_python_ops) and the rewrites of the model code `module` runs
    (export_rewrites), applied while it lasts."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(applied("ort_export"))
        stack.enter_context(applied(_AUTOGRAD_FUNCTIONS))
        stack.enter_context(applied(_PYTHON_OPS))
        stack.enter_context(applied(_TORCH_KERNELS))
        if "transformers.integrations.moe" in sys.modules:  # a model of transformers' experts may be exported
            stack.enter_context(applied(_TORCH_EXPERTS))
        for group in export_rewrites.groups_for(module):
            stack.enter_context(applied(group))
        yield


for _name, _owner, _attribute, _reason, _factory in [
    (
        "ort.configure_ort_compatible_zero_stage3", "onnxruntime.training.utils.hooks",
        "configure_ort_compatible_zero_stage3",
        "ORTModule calls it when ORTMODULE_ENABLE_ZERO_STAGE3=1; it fails on DeepSpeed >= 0.14 (rebinds closures "
        "DeepSpeed renamed). ort_zero's subscriber replaces it.",
        _deferred(lambda: _integration().configure_hooks),
    ),
    (
        "ort.stage3_export_context", _GTM, "stage3_export_context",
        "ORT's context imports torch.onnx._internal._beartype (gone in torch >= 2.5), and exporting must see "
        "full-sized stand-ins for partitioned parameters without running collectives.",
        _deferred(lambda: functools.partial(_integration().export_context, during_export=_during_export)),
    ),
    (
        "ort.parse_outputs_for_onnx_export_and_extract_schema", _IO,
        "parse_outputs_for_onnx_export_and_extract_schema",
        "ORTModule's schema-reading forward runs before the export context; it must not gather either.",
        _deferred(lambda: functools.partial(_integration().schema_forward, during_export=_during_export)),
    ),
    (
        "ort.can_module_be_deep_cloned", _IO, "can_module_be_deep_cloned",
        "deep copies of ZeRO-3 parameters lose ds_* attributes and break the hooks.",
        _deferred(lambda: _integration().deep_clone_check),
    ),
    (
        "ort.post_export_process", f"{_GTM}:GraphTransitionManager", "_post_export_process",
        "ORT's stage-3 rewrite leaves removed parameters in ORTModule's input lists and never feeds the trigger; "
        "ort_zero runs its own passes and keeps the lists in step.",
        _deferred(lambda: _integration().post_export_process),
    ),
    *(
        (
            f"ort.{check}_as_list", f"{_GTM}:GraphTransitionManager", f"_add_check_{check}",
            "ORT returns None instead of its hooks when the compute optimizer is off "
            "(ORTMODULE_ENABLE_COMPUTE_OPTIMIZER=0), then iterates over them: every export fails.",
            _deferred(lambda: _integration().sparsity_hooks_as_list),
        )
        for check in ("embedding_sparsity_hook", "label_sparsity_hook")
    ),
    (
        "ort.loud_fallback", f"{_ORTM}._fallback:_FallbackManager", "fallback",
        "a fallback to PyTorch is logged once by ORT, at warning level, where ranks other than 0 may not show it; "
        "ort_zero announces it on every rank.",
        _deferred(lambda: _integration().loud_fallback),
    ),
    (
        "ort.session_options", _GEM, "_get_session_config",
        "ORTModule sizes ORT's intra-op pool to all cores in every process; ranks sharing a machine oversubscribe "
        "it (measured: 390 ms vs 263 ms per step with 2 CPU ranks). Threads follow OMP_NUM_THREADS or the rank's "
        "share of the cores. ORT_ZERO_CPU_MEM_ARENA=0 turns ORT's CPU arena off (memory measurements).",
        _deferred(lambda: _integration().session_options),
    ),
]:  # fmt: skip
    _ort("ort", _name, _owner, _attribute, _reason, _factory)


def _noting_parameter_reads(getitem: Any) -> Any:
    from .zero3.external_params import noting_reads

    return noting_reads(getitem)


_deepspeed(
    "ort_export", "deepspeed.parameter_reads_in_export", "deepspeed.runtime.zero.parameter_offload:ZeROOrderedDict",
    "__getitem__",
    "DeepSpeed registers a parameter read outside its module's forward as an external parameter at the first eager "
    "access, which an export never makes (its stand-ins are available): while ORTModule's output-schema forward "
    "runs before the export, such reads are noted and registered the same way (zero3/external_params.py).",
    _noting_parameter_reads,
)  # fmt: skip


_deepspeed(
    "ort_export", "deepspeed.memory_efficient_linear_in_export", "torch.nn.functional", "linear",
    "zero.Init leaves F.linear as DeepSpeed's LinearFunctionForZeroStage3, an autograd Function that saves "
    "the weight it is given: traced into an ORT graph it keeps every gathered weight alive until the backward "
    "and runs each Linear in PyTorch through a PythonOp. While ORTModule exports a ZeRO-3 model, F.linear is "
    "torch's own, so Linear layers become ORT's Gemm/MatMul and the backward re-gathers their weights.",
    ds_internals.torch_linear_behind_zero3_wrap,
)  # fmt: skip
_torch(
    "ort_export", "torch.onnx_shape_inference_without_stand_ins", "torch._C",
    "_jit_pass_onnx_graph_shape_type_inference",
    "the TorchScript exporter hands its whole-graph shape inference every parameter, which keeps a dense "
    "copy of each as a constant value: for a ZeRO-3 export, whose parameters are stand-ins that cost no memory, "
    "the whole model on every rank. While ORTModule exports a ZeRO-3 model the pass gets every parameter but "
    "the stand-ins (their shapes are in the graph's input types).",
    export_context.shape_inference_without_stand_ins,
)  # fmt: skip
_torch(
    "ort_export", "torch.lower_unread_bridge_tuples", "torch._C", "_jit_pass_lower_all_tuples",
    "a bridge returns its module's tensors as one tuple; where nothing reads them (types "
    f"{', '.join(export_tuples.MODEL_TYPES)}) the tracer drops the unpack but keeps the PythonOp, and torch's tuple "
    "lowering stops the export (Couldn't lower all tuples): while ORTModule exports a ZeRO-3 model each such tuple "
    "gets an unpack nothing reads, and is flattened like the others (ort_zero/ort/export_tuples.py)",
    export_tuples.lowering_unread_tuples,
)  # fmt: skip

for _method in ("scatter", "scatter_"):
    _torch(
        "ort_export", f"torch.{_method}_value_in_export", "torch:Tensor", _method,
        "torch's TorchScript exporter fails an internal assert (alias analysis) on a scatter of a Python bool (the "
        "DeepSeek-V3.2-style sparse attention's mask): while ORTModule exports a ZeRO-3 model, the bool is scattered "
        "as the int 0 or 1 (the same values in a bool tensor)",
        export_rewrites.int_and_bool_ops.scatter_bool_value_as_int,
    )  # fmt: skip

# Model code ONNX cannot express, rewritten while a model that runs it is exported (ort_zero/ort/export_rewrites/).
for _rewrite in export_rewrites.REWRITES:
    for _replacement in _rewrite.replacements:
        _declaration = (_rewrite.group, _replacement.name, _replacement.owner, _replacement.attribute, _rewrite.reason)
        if _replacement.package == "transformers":
            _transformers(*_declaration, _replacement.factory, _rewrite.model_types)
        else:
            _torch(*_declaration, _replacement.factory)

# Torch ops ORT cannot export or differentiate, run by torch in PythonOps while a ZeRO-3 model is exported
# (ort_zero/ort/export_python_ops.py: each op, why, and the model types that need it).
_PYTHON_OPS = "export_python_ops"
for _op in export_python_ops.PYTHON_OPS:
    _torch(_PYTHON_OPS, _op.name, _op.owner, _op.attribute, _op.reason, _op.replacing)

# Attention and experts as torch's own kernels in PythonOps while a ZeRO-3 model is exported
# (ort_zero/ort/torch_kernels/: what each saves, and how the layer-wise recompute re-runs them).
_TORCH_KERNELS = "torch_kernels"
_torch(
    _TORCH_KERNELS, "torch.sdpa_as_fused_kernel", "torch.nn.functional", "scaled_dot_product_attention",
    "torch's exporter writes scaled_dot_product_attention as MatMul + Softmax: ORT then keeps a heads x seq x seq "
    "probability tensor per layer for the backward (seq^2 memory); run by torch's fused kernel in a PythonOp, only "
    "its output and log-sum-exp are kept (and nothing, under the layer-wise recompute)",
    torch_kernels.sdpa_in_torch,
)  # fmt: skip
_torch(
    _TORCH_KERNELS, "torch.cross_entropy_in_torch", "torch.nn.functional", "cross_entropy",
    "ORT 1.19.2's CPU SoftmaxCrossEntropyLoss takes 3x torch's time on a causal LM's logits ([1024, 32000]: 0.48 vs "
    "0.16 s, one thread): a language model's loss runs as torch's log-softmax and NLL loss in a PythonOp",
    torch_kernels.cross_entropy_in_torch,
)  # fmt: skip
_ort(
    "ort", "ort.kernel_failure_raised", f"{_ORTM}._execution_agent:TrainingAgent", "run_forward",
    "ORT prints a PythonOp's Python error and raises 'Get null result' for the node: a torch kernel's failure "
    "(ort_zero/ort/torch_kernels/failures.py) is raised as the step's error, naming the layer and what to pick",
    torch_kernels.raising_kernel_failure,
)  # fmt: skip
_torch(
    _TORCH_KERNELS, "torch.linear_as_torch_matmul", "torch.nn:Linear", "forward",
    "ORT 1.19.2's CPU MatMul takes 1.26-1.34x torch's time on a LLaMA-160M's linear layers at seq 1024 (one thread), "
    "and at long sequences a step is matmuls (ORT-ZeRO3's step 1.26x native's): nn.Linear runs as torch's matmuls in "
    "a PythonOp, on the module's own ZeRO-3 parameters",
    torch_kernels.linear_in_torch,
)  # fmt: skip
_TORCH_EXPERTS = "torch_kernels_experts"
_transformers(
    _TORCH_EXPERTS, "transformers.experts_in_torch", "transformers.integrations.moe:ExpertsInterface",
    "get_interface",
    "transformers' experts implementations cannot be exported as they run: grouped_mm (the default) counts tokens "
    "per expert with torch.histc (no symbolic), eager loops over the routed experts in Python (the trace keeps one "
    "batch's routing), batched_mm copies every expert's weights per (token, expert) pair (3.7x native's memory at "
    "87M): the chosen implementation runs in torch in a PythonOp, its backward by torch's autograd",
    torch_kernels.experts_in_torch, ("mixture-of-experts",),
)  # fmt: skip

# Users' checkpoints while a ZeRO-3 model is exported (why and how: ort_zero/zero3/checkpointing.py).
_POLICY = "ORT cannot run a checkpoint: under ZeRO-3 it runs directly at ORTMODULE_MEMORY_OPT_LEVEL 1/2 (ort_zero's "
_POLICY += "layer-wise recompute does its job), and stops the run with one line at 0. "
_torch(
    "ort_export", "torch.checkpoint_in_export", "torch.utils.checkpoint:CheckpointFunction", "apply",
    _POLICY + "every reentrant call arrives here, however checkpoint was bound",
    _deferred(lambda: _checkpointing().torch_checkpoint_apply),
)  # fmt: skip
_deepspeed(
    "ort_export", "deepspeed.checkpoint_in_export",
    "deepspeed.runtime.activation_checkpointing.checkpointing:CheckpointFunction", "apply",
    _POLICY + "every call arrives here, however checkpoint was bound",
    _deferred(lambda: _checkpointing().deepspeed_checkpoint_apply),
)  # fmt: skip
_ort(
    "ort_export", "ort.checkpoint_wrappers_in_export", _ORTM, "ORTMODULE_ONNX_EXPORT_CONTEXT",
    _POLICY + "ORT's checkpoint wrappers run the function (and print) at level 1 while this flag says an export "
    "runs; a fresh [False] (read nowhere else) makes them hand every call on",
    lambda replaced: [False],
)  # fmt: skip
_ort(
    "ort", "ort.checkpoint_announcement", f"{_GTM}:GraphTransitionManager", "_export_model",
    _POLICY + "ORT captures what is printed while it exports and shows it on rank 0 only: the announcement comes "
    "after the export",
    _deferred(lambda: _checkpointing().announcing_after),
)  # fmt: skip

_ort(
    "ort", "ort.export_overrides", f"{_ORTM}._custom_op_symbolic_registry:CustomOpSymbolicRegistry", "register_all",
    "torch's exporter with ORTModule's symbolics writes some aten ops in a form ORT 1.19.2 rejects (a LayerNorm "
    "without weight) or not at all (expm1): each ORTModule registers ORT's symbolics, then ort_zero's overrides "
    "(ort_zero/ort/export_overrides.py: each op, why, and the model types that need it). Registrations stay with "
    "torch's exporter until the next ORTModule registers ORT's again.",
    _deferred(lambda: _export_overrides().registering_overrides),
)  # fmt: skip

# ORT's symbolic shape inference on graphs it gave up on (ort_zero/ort/shape_inference.py says where and why).
_ort(
    "ort", "ort.shape_inference_finite_values", "onnxruntime.tools.symbolic_shape_infer:SymbolicShapeInference",
    "_try_get_value",
    "ORT's symbolic shape inference converts every constant it follows to an int: an infinite one (a clamp's "
    "upper limit, in the Mamba-2 mixers) raised OverflowError; a value that is not finite is no shape: unknown",
    shape_inference.finite_values_only,
)  # fmt: skip
_ort(
    "ort", "ort.shape_inference_recursion", f"{_GTM}:GraphTransitionManager", "_infer_shapes",
    "ORT's symbolic shape inference recursed beyond Python's default limit on the Mamba-2 mixers' scan: the limit "
    "is raised while it runs",
    shape_inference.with_deeper_recursion,
)  # fmt: skip


def _gradients() -> Any:
    from .ort import gradients

    return gradients


_ort(
    "ort", "ort.custom_gradients", f"{_ORTM}._custom_gradient_registry:CustomGradientRegistry", "register_all",
    "ORT 1.19.2 has no gradient builder for some ops torch's exporter writes (CumSum): each ORTModule registers ORT's "
    "custom gradients, then ort_zero's (ort_zero/ort/gradients.py: each gradient, its math, and the model types that "
    "need it). ORT's C++ registry has no way to remove a definition: they stay registered after a revert.",
    _deferred(lambda: _gradients().registering_gradients),
)  # fmt: skip

# What ORTModule prints (why each line goes: ort_zero/ort/console.py).
_ort(
    "ort", "ort.quiet_logger", f"{_ORTM}.ortmodule", "configure_ortmodule_logger",
    "ORT warns on every ZeRO-3 export that the user asked not to deep-copy the model (ort_zero skips the copy on "
    "purpose) and prints its captured export log at warning level: the first goes, the second is DEBUG",
    console.quiet_logger,
)  # fmt: skip
_ort(
    "ort", "ort.feature_table", _GEM, "_log_feature_stats",
    "ORT's feature table says 'ZeRO Stage3 Support: OFF' and names ORT's memory optimizer while ort_zero runs "
    "ZeRO-3 and its own recompute: not shown for a ZeRO-3 model",
    console.feature_table_unless_zero3,
)  # fmt: skip
_ort(
    "ort", "ort.graph_optimizers", f"{_ORTM}.graph_optimizer_registry:GraphOptimizerRegistry", "optimize_all",
    "the complete forward+backward graph is only reachable here, before ORT builds the session: ort_zero's pass "
    "makes each module's backward read parameters gathered again for it instead of the forward's copies (ZeRO-3 "
    "memory). ORT's registry has no way to remove a registered optimizer, so it is wrapped rather than registered, "
    "which keeps the patch reversible.",
    _deferred(lambda: _integration().graph_optimizers),
)  # fmt: skip
_ort(
    "ort", "ort.graph_built_by", f"{_ORTM}._training_manager:TrainingManager", "_build_graph",
    "ORT's graph-optimizer registry is told only the model's class name: while a TrainingManager builds its graph "
    "ort_zero notes which, so the training-graph passes' buffer plans stay with that model (a model that falls "
    "back forgets its own, not every model's).",
    _deferred(lambda: _integration().graph_built_by),
)  # fmt: skip


def _trimmed_after_backward(replaced: Any) -> Any:
    from .ort.footprint import trimmed_after_backward

    return trimmed_after_backward(replaced)


_ort(
    "ort", "ort.trim_after_backward", f"{_ORTM}._execution_agent:TrainingAgent", "run_backward",
    "every step leaves more freed memory in glibc's heap under ORT than in PyTorch (1.2 vs 0.75 GiB per rank on a "
    "162M LLaMA): after each backward the heap's free pages go back to the OS.",
    _trimmed_after_backward,
)  # fmt: skip


def _trimmed_after_forward(replaced: Any) -> Any:
    from .ort.footprint import trimmed_after_forward

    return trimmed_after_forward(replaced)


_ort(
    "ort", "ort.trim_after_forward", f"{_ORTM}._execution_agent:TrainingAgent", "run_forward",
    "a forward leaves in glibc's heap what it did not keep for the backward (most activations under the layer-wise "
    "recompute: 0.6 GiB per rank on a 162M LLaMA at seq 1024), the first also the export's garbage (1.0 GiB): after "
    "each the heap's free pages go back to the OS.",
    _trimmed_after_forward,
)  # fmt: skip


def _training_execution_agent(replaced: Any) -> Any:
    integration = _integration()
    return cuda_provider_required(integration.footprint_trimmed(integration.zero3_memory_optimizer_off(replaced)))


_CUDA_REASON = (
    "when ORT's CUDA provider cannot load, ORT builds the session on the CPU provider and ORTModule trains a CUDA "
    "model on the CPU without a word; ort_zero refuses, naming what failed to load."
)
_ort(
    "ort", "ort.cuda_provider_required.TrainingManager", f"{_ORTM}._training_manager:TrainingManager",
    "_create_execution_agent",
    _CUDA_REASON + " And for a ZeRO-3 graph ORT's own memory optimizer (ORTMODULE_MEMORY_OPT_LEVEL/CONFIG) stays "
    "off: it cannot recompute through the bridges and its recompute reads forward-gathered parameters; ort_zero's "
    "recompute pass applies the level instead, and ORT's probe of it (a second session built at the first step "
    "only to list what it could recompute) is not built. Once the session exists what ORTModule keeps beyond its "
    "needs goes: "
    "its graph builder (it makes a new one for every build), the dead memory of its graphs' protobufs and the "
    "session's copy of the model bytes (measured: 37 + 17 + 2 MiB per rank, small GPT with 16 blocks).",
    _training_execution_agent,
)  # fmt: skip
_ort(
    "ort", "ort.cuda_provider_required.InferenceManager", f"{_ORTM}._inference_manager:InferenceManager",
    "_create_execution_agent", _CUDA_REASON, cuda_provider_required,
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# Model outputs ORTModule's schema code cannot walk (ort_zero/ort/output_structures.py says why and how).
_OUTPUTS_REASON = (
    "ORTModule's output walk knows tensors, numbers, sequences and mappings only: a Hugging Face causal LM at its "
    "defaults (use_cache=True) returns a transformers DynamicCache and every export stopped with 'Unsupported "
    "flatten data type'. Where ORT's walk fails, torch's pytree walks the outputs and objects of plain attributes "
    "that hold tensors are taken apart"
)
_ort(
    "ort", "ort.outputs_of_any_structure", _IO, "_extract_schema",
    _OUTPUTS_REASON + " (their tensors become graph outputs).",
    output_structures.extracting_any_structure,
)  # fmt: skip
_ort(
    "ort", "ort.outputs_rebuilt_from_any_structure", _GTM, "unflatten_data_using_schema",
    _OUTPUTS_REASON + ", and put together again after every ORT run (ORT's own schemas are ORT's).",
    output_structures.rebuilding_any_structure,
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# Autograd Functions of model and library code (TRL's, PhiMoE's, Reformer's, users'), exported while a ZeRO-3 model is
# exported as PythonOps ORT can run: tensor outputs only, one gradient per input (ort_zero/ort/export_autograd.py).
_AUTOGRAD_FUNCTIONS = "export_autograd_functions"
_torch(
    _AUTOGRAD_FUNCTIONS, "torch.autograd_function_with_tensor_outputs_in_export", "torch.autograd.function:Function",
    "apply",
    "ORT 1.19.2's PythonOp takes tensor outputs only and one gradient per input, present for each input it "
    "differentiates; PyTorch lets a Function return None or numbers (TRL's ChunkedLogProbFunction), None gradients "
    "(PhiMoE) and extra trailing Nones (Reformer). While ORTModule exports a ZeRO-3 model every Function but "
    "ort_zero's and ORT's own runs through a wrapper with tensor outputs (constants back to the caller, checked at "
    "each run) and one gradient per input (zeros for None)",
    export_autograd.applying_with_tensor_outputs,
)  # fmt: skip


def _foreign_gathers() -> Any:
    from .zero3 import foreign_gathers

    return foreign_gathers


# TRL's trainers in ORT (ort_zero/integrations/trl.py): applied when an ORTZeroTrainer is created with TRL imported.
TRL = "trl"
register(
    Patch(
        "trl.lm_head_gather_of_parameters_only", "trl.trainer.utils", "maybe_gather_lm_head_ctx", "trl",
        TRL_VERSIONS,
        "TRL's ChunkedLogProbFunction gathers the LM head's ZeRO-3 parameters again in its backward; run by ORT as a "
        "PythonOp it receives the full tensors ort_zero's bridges gathered (plain tensors, no ds_status): only "
        "ZeRO-3 parameters are gathered, the rest are full already",
        _deferred(lambda: _foreign_gathers().gathering_parameters_only),
    ),
    TRL,
)  # fmt: skip
