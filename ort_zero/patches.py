"""The one registry of symbols ort_zero replaces in DeepSpeed and ONNX Runtime.

Every monkey patch in the package is declared here with what it replaces, why, and for which versions. The only
other code in ort_zero that reads another package's private names or writes into its objects is `ort_zero.foreign`,
one module per package (tests/unit/foreign checks that nothing else reaches). How patches are applied and reverted
(by name, in groups, restoring the original object exactly) is `ort_zero.patching`; its API is used through this
module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .foreign.versions import DEEPSPEED_VERSIONS, ORT_VERSIONS, TORCH_VERSIONS
from .ort import console, export_context, torch_compat
from .patching import (  # noqa: F401  (the registry's API, used as ort_zero.patches.*)
    Patch,
    UnsupportedVersionError,
    applied,
    apply_group,
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


def _checkpointing() -> Any:
    from .zero3 import checkpointing

    return checkpointing


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
    register(
        Patch(_name, _owner, _attribute, "torch", TORCH_VERSIONS, _TS_MOVED, _replacement, adds=True),
        group="torch_onnx",
    )

register(
    Patch(
        name="torch.onnx.export_for_ort",
        owner_path="torch.onnx",
        attribute="export",
        distribution="torch",
        versions=TORCH_VERSIONS,
        reason="torch >= 2.9 exports with dynamo by default, which makes no PythonOps, and ORT does not pass "
        "dynamo=False: called from ONNX Runtime's own modules, dynamo is off unless asked for; every other "
        "caller keeps torch's default.",
        make_replacement=torch_compat.torchscript_export_for_ort,
    ),
    group="torch_onnx",
)


def _zero3_setup_hooks(_deepspeeds: Any) -> Any:
    from .zero3.install import setup_zero_stage3_hooks

    return setup_zero_stage3_hooks


register(
    Patch(
        name="deepspeed.setup_zero_stage3_hooks",
        owner_path="deepspeed.runtime.zero.parameter_offload:DeepSpeedZeRoOffload",
        attribute="setup_zero_stage3_hooks",
        distribution="deepspeed",
        versions=DEEPSPEED_VERSIONS,
        reason="ZeRO-3's gathers and releases must run through autograd-Function bridges (PythonOps under ORT) "
        "instead of DeepSpeed's per-module closures, which ORT cannot tell apart and which run collectives "
        "while tracing.",
        make_replacement=_zero3_setup_hooks,
    ),
    group="zero3",
)

_GTM = "onnxruntime.training.ortmodule._graph_transition_manager"
_IO = "onnxruntime.training.ortmodule._io"


def _during_export() -> Any:
    """What the replacements that run around an export enter: the "ort_export" group, applied while it lasts."""
    return applied("ort_export")


for _name, _owner, _attribute, _factory, _reason in [
    (
        "ort.configure_ort_compatible_zero_stage3",
        "onnxruntime.training.utils.hooks",
        "configure_ort_compatible_zero_stage3",
        _deferred(lambda: _integration().configure_hooks),
        "ORTModule calls it when ORTMODULE_ENABLE_ZERO_STAGE3=1; it fails on DeepSpeed >= 0.14 (rebinds closures "
        "DeepSpeed renamed). ort_zero's subscriber replaces it.",
    ),
    (
        "ort.stage3_export_context",
        _GTM,
        "stage3_export_context",
        _deferred(lambda: functools.partial(_integration().export_context, during_export=_during_export)),
        "ORT's context imports torch.onnx._internal._beartype (gone in torch >= 2.5), and exporting must see "
        "full-sized stand-ins for partitioned parameters without running collectives.",
    ),
    (
        "ort.parse_outputs_for_onnx_export_and_extract_schema",
        _IO,
        "parse_outputs_for_onnx_export_and_extract_schema",
        _deferred(lambda: functools.partial(_integration().schema_forward, during_export=_during_export)),
        "ORTModule's schema-reading forward runs before the export context; it must not gather either.",
    ),
    (
        "ort.can_module_be_deep_cloned",
        _IO,
        "can_module_be_deep_cloned",
        _deferred(lambda: _integration().deep_clone_check),
        "deep copies of ZeRO-3 parameters lose ds_* attributes and break the hooks.",
    ),
    (
        "ort.post_export_process",
        f"{_GTM}:GraphTransitionManager",
        "_post_export_process",
        _deferred(lambda: _integration().post_export_process),
        "ORT's stage-3 rewrite leaves removed parameters in ORTModule's input lists and never feeds the trigger; "
        "ort_zero runs its own passes and keeps the lists in step.",
    ),
    (
        "ort.loud_fallback",
        "onnxruntime.training.ortmodule._fallback:_FallbackManager",
        "fallback",
        _deferred(lambda: _integration().loud_fallback),
        "a fallback to PyTorch is logged once by ORT, at warning level, where ranks other than 0 may not show it; "
        "ort_zero announces it on every rank.",
    ),
    (
        "ort.session_options",
        "onnxruntime.training.ortmodule._graph_execution_manager:GraphExecutionManager",
        "_get_session_config",
        _deferred(lambda: _integration().session_options),
        "ORTModule sizes ORT's intra-op pool to all cores in every process; ranks sharing a machine oversubscribe "
        "it (measured: 390 ms vs 263 ms per step with 2 CPU ranks). Threads follow OMP_NUM_THREADS or the rank's "
        "share of the cores. ORT_ZERO_CPU_MEM_ARENA=0 turns ORT's CPU arena off (memory measurements).",
    ),
]:
    register(
        Patch(
            name=_name,
            owner_path=_owner,
            attribute=_attribute,
            distribution="onnxruntime-training",
            versions=ORT_VERSIONS,
            reason=_reason,
            make_replacement=_factory,
        ),
        group="ort",
    )


def _plain_linear_in_export(current: Any) -> Any:
    from deepspeed.runtime.zero.linear import zero3_linear_wrap
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    return (
        getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", current)
        if current is zero3_linear_wrap
        else current
    )


register(
    Patch(
        name="deepspeed.memory_efficient_linear_in_export",
        owner_path="torch.nn.functional",
        attribute="linear",
        distribution="deepspeed",
        versions=DEEPSPEED_VERSIONS,
        reason="zero.Init leaves F.linear as DeepSpeed's LinearFunctionForZeroStage3, an autograd Function that saves "
        "the weight it is given: traced into an ORT graph it keeps every gathered weight alive until the backward "
        "and runs each Linear in PyTorch through a PythonOp. While ORTModule exports a ZeRO-3 model, F.linear is "
        "torch's own, so Linear layers become ORT's Gemm/MatMul and the backward re-gathers their weights.",
        make_replacement=_plain_linear_in_export,
    ),
    group="ort_export",
)


register(
    Patch(
        name="torch.onnx_shape_inference_without_stand_ins",
        owner_path="torch._C",
        attribute="_jit_pass_onnx_graph_shape_type_inference",
        distribution="torch",
        versions=TORCH_VERSIONS,
        reason="the TorchScript exporter hands its whole-graph shape inference every parameter, which keeps a dense "
        "copy of each as a constant value: for a ZeRO-3 export, whose parameters are stand-ins that cost no memory, "
        "the whole model on every rank. While ORTModule exports a ZeRO-3 model the pass gets every parameter but "
        "the stand-ins (their shapes are in the graph's input types).",
        make_replacement=export_context.shape_inference_without_stand_ins,
    ),
    group="ort_export",
)


# Users' checkpoints while a ZeRO-3 model is exported (why and how: ort_zero/zero3/checkpointing.py).
_POLICY = "ORT cannot run a checkpoint: under ZeRO-3 it runs directly at ORTMODULE_MEMORY_OPT_LEVEL 1/2 (ort_zero's "
_POLICY += "layer-wise recompute does its job), and stops the run with one line at 0. "
_CHECKPOINTS = "deepspeed.runtime.activation_checkpointing.checkpointing"
for _name, _owner, _attribute, _distribution, _versions, _reason, _replacement, _group in [
    ("torch.checkpoint_in_export", "torch.utils.checkpoint:CheckpointFunction", "apply", "torch", TORCH_VERSIONS,
     "every reentrant call arrives here, however checkpoint was bound",
     _deferred(lambda: _checkpointing().torch_checkpoint_apply), "ort_export"),
    ("deepspeed.checkpoint_in_export", f"{_CHECKPOINTS}:CheckpointFunction", "apply", "deepspeed", DEEPSPEED_VERSIONS,
     "every call arrives here, however checkpoint was bound",
     _deferred(lambda: _checkpointing().deepspeed_checkpoint_apply), "ort_export"),
    ("ort.checkpoint_wrappers_in_export", "onnxruntime.training.ortmodule", "ORTMODULE_ONNX_EXPORT_CONTEXT",
     "onnxruntime-training", ORT_VERSIONS, "ORT's checkpoint wrappers run the function (and print) at level 1 while "
     "this flag says an export runs; a fresh [False] (read nowhere else) makes them hand every call on",
     lambda replaced: [False], "ort_export"),
    ("ort.checkpoint_announcement", f"{_GTM}:GraphTransitionManager", "_export_model", "onnxruntime-training",
     ORT_VERSIONS, "ORT captures what is printed while it exports and shows it on rank 0 only: the announcement "
     "comes after the export", _deferred(lambda: _checkpointing().announcing_after), "ort"),
]:  # fmt: skip
    register(Patch(_name, _owner, _attribute, _distribution, _versions, _POLICY + _reason, _replacement), _group)


# What ORTModule prints (why each line goes: ort_zero/ort/console.py).
for _name, _owner, _attribute, _factory, _reason in [
    ("ort.quiet_logger", "onnxruntime.training.ortmodule.ortmodule", "configure_ortmodule_logger", console.quiet_logger,
     "ORT warns on every ZeRO-3 export that the user asked not to deep-copy the model (ort_zero skips the copy on "
     "purpose) and prints its captured export log at warning level: the first goes, the second is DEBUG"),
    ("ort.feature_table", "onnxruntime.training.ortmodule._graph_execution_manager:GraphExecutionManager",
     "_log_feature_stats", console.feature_table_unless_zero3,
     "ORT's feature table says 'ZeRO Stage3 Support: OFF' and names ORT's memory optimizer while ort_zero runs "
     "ZeRO-3 and its own recompute: not shown for a ZeRO-3 model"),
]:  # fmt: skip
    register(
        Patch(_name, _owner, _attribute, "onnxruntime-training", ORT_VERSIONS, _reason, _factory),
        group="ort",
    )


register(
    Patch(
        name="ort.graph_optimizers",
        owner_path="onnxruntime.training.ortmodule.graph_optimizer_registry:GraphOptimizerRegistry",
        attribute="optimize_all",
        distribution="onnxruntime-training",
        versions=ORT_VERSIONS,
        reason="the complete forward+backward graph is only reachable here, before ORT builds the session: "
        "ort_zero's pass makes each module's backward read parameters gathered again for it instead of the "
        "forward's copies (ZeRO-3 memory). ORT's registry has no way to remove a registered optimizer, so it is "
        "wrapped rather than registered, which keeps the patch reversible.",
        make_replacement=_deferred(lambda: _integration().graph_optimizers),
    ),
    group="ort",
)


def _trimmed_after_backward(replaced: Any) -> Any:
    from .ort.footprint import trimmed_after_backward

    return trimmed_after_backward(replaced)


register(
    Patch(
        name="ort.trim_after_backward",
        owner_path="onnxruntime.training.ortmodule._execution_agent:TrainingAgent",
        attribute="run_backward",
        distribution="onnxruntime-training",
        versions=ORT_VERSIONS,
        reason="every step leaves more freed memory in glibc's heap under ORT than in PyTorch (1.2 vs 0.75 GiB per "
        "rank on a 162M LLaMA): after each backward the heap's free pages go back to the OS.",
        make_replacement=_trimmed_after_backward,
    ),
    group="ort",
)


def _training_execution_agent(replaced: Any) -> Any:
    integration = _integration()
    return cuda_provider_required(integration.footprint_trimmed(integration.zero3_memory_optimizer_off(replaced)))


_CUDA_REASON = (
    "when ORT's CUDA provider cannot load, ORT builds the session on the CPU provider and ORTModule trains a CUDA "
    "model on the CPU without a word; ort_zero refuses, naming what failed to load."
)
for _manager, _factory, _reason in [
    (
        "_training_manager:TrainingManager",
        _training_execution_agent,
        _CUDA_REASON + " And for a ZeRO-3 graph ORT's own memory optimizer (ORTMODULE_MEMORY_OPT_LEVEL/CONFIG) stays "
        "off: it cannot recompute through the bridges and its recompute reads forward-gathered parameters; "
        "ort_zero's recompute pass applies the level instead. Once the session exists what ORTModule keeps beyond "
        "its needs goes: its graph builder (it makes a new one for every build), the dead memory of its graphs' "
        "protobufs and the session's copy of the model bytes (measured: 37 + 17 + 2 MiB per rank, small GPT with 16 "
        "blocks).",
    ),
    ("_inference_manager:InferenceManager", cuda_provider_required, _CUDA_REASON),
]:
    register(
        Patch(
            name=f"ort.cuda_provider_required.{_manager.partition(':')[2]}",
            owner_path=f"onnxruntime.training.ortmodule.{_manager}",
            attribute="_create_execution_agent",
            distribution="onnxruntime-training",
            versions=ORT_VERSIONS,
            reason=_reason,
            make_replacement=_factory,
        ),
        group="ort",
    )
