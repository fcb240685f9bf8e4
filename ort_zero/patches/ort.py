"""ONNX Runtime's ORTModule: how it exports, builds and runs a ZeRO-3 model's session, what it prints, and the model
outputs and ops it cannot handle. The whole `patch_groups.ORT` group, applied by `enable_zero3()`."""

from __future__ import annotations

from ..memory import footprint
from ..ort.export import gradients as export_gradients
from ..ort.export import overrides as export_overrides
from ..ort.ortmodule import console, output_structures, shape_inference
from ..ort.step import torch_kernels
from ..patch_groups import ORT
from ..stack.cuda_provider import cuda_provider_required
from .declare import GEM, GTM, IO, ORTM, deferred, ort_patch, ort_zero_module
from .export import CHECKPOINT_POLICY

# ort_zero's replacements of ORTModule's own classes, one module each, imported when their patches apply: each imports
# the graph passes, which import DeepSpeed (importing the declarations imports neither DeepSpeed nor ORT).
GRAPH_TRANSITION = "ort.ortmodule.graph_transition_manager"
TRAINING = "ort.ortmodule.training_manager"
EXECUTION = "ort.ortmodule.graph_execution_manager"
INFERENCE = "ort.ortmodule.inference_manager"

for _name, _owner, _attribute, _reason, _factory in [
    (
        "ort.configure_ort_compatible_zero_stage3", "onnxruntime.training.utils.hooks",
        "configure_ort_compatible_zero_stage3",
        "ORTModule calls it when ORTMODULE_ENABLE_ZERO_STAGE3=1; it fails on DeepSpeed >= 0.14 (rebinds closures "
        "DeepSpeed renamed). ort_zero's subscriber replaces it.",
        deferred(lambda: ort_zero_module(EXECUTION).configure_hooks),
    ),
    (
        "ort.stage3_export_context", GTM, "stage3_export_context",
        "ORT's context imports torch.onnx._internal._beartype (gone in torch >= 2.5), and exporting must see "
        "full-sized stand-ins for partitioned parameters without running collectives.",
        deferred(lambda: ort_zero_module(GRAPH_TRANSITION).export_context),
    ),
    (
        "ort.exported_in_one_forward", f"{GTM}:GraphTransitionManager", "_get_exported_model",
        "ORTModule runs a model's forward for its outputs' structure before it traces it, outside the export "
        "context (where it must not gather either); a ZeRO-3 model's trace is its only forward (MoE 87M: 0.35 s "
        "of a 1.5-s export), the outputs named as it returns.",
        deferred(lambda: ort_zero_module(GRAPH_TRANSITION).exported_in_one_forward),
    ),
    (
        "ort.can_module_be_deep_cloned", IO, "can_module_be_deep_cloned",
        "deep copies of ZeRO-3 parameters lose ds_* attributes and break the hooks.",
        deferred(lambda: ort_zero_module(GRAPH_TRANSITION).deep_clone_check),
    ),
    (
        "ort.post_export_process", f"{GTM}:GraphTransitionManager", "_post_export_process",
        "ORT's stage-3 rewrite leaves removed parameters in ORTModule's input lists and never feeds the trigger; "
        "ort_zero runs its own passes and keeps the lists in step.",
        deferred(lambda: ort_zero_module(GRAPH_TRANSITION).post_export_process),
    ),
    *(
        (
            f"ort.{check}_as_list", f"{GTM}:GraphTransitionManager", f"_add_check_{check}",
            "ORT returns None instead of its hooks when the compute optimizer is off "
            "(ORTMODULE_ENABLE_COMPUTE_OPTIMIZER=0), then iterates over them: every export fails.",
            deferred(lambda: ort_zero_module(GRAPH_TRANSITION).sparsity_hooks_as_list),
        )
        for check in ("embedding_sparsity_hook", "label_sparsity_hook")
    ),
    (
        "ort.loud_fallback", f"{ORTM}._fallback:_FallbackManager", "fallback",
        "a fallback to PyTorch is logged once by ORT, at warning level, where ranks other than 0 may not show it; "
        "ort_zero announces it on every rank.",
        deferred(lambda: ort_zero_module(EXECUTION).loud_fallback),
    ),
    (
        "ort.session_options", GEM, "_get_session_config",
        "ORTModule sizes ORT's intra-op pool to all cores in every process; ranks sharing a machine oversubscribe "
        "it (measured: 390 ms vs 263 ms per step with 2 CPU ranks). Threads follow OMP_NUM_THREADS or the rank's "
        "share of the cores. ORT's CPU arena never hands memory back: for a CPU graph that recomputes its layers it "
        "would hold the recompute's high-water mark through the optimizer step, so it is off there unless "
        "ORT_ZERO_CPU_MEM_ARENA says otherwise (0/1 choose for every session).",
        deferred(lambda: ort_zero_module(EXECUTION).session_options),
    ),
]:  # fmt: skip
    ort_patch(ORT, _name, _owner, _attribute, _reason, _factory)
ort_patch(
    ORT, "ort.kernel_failure_raised", f"{ORTM}._execution_agent:TrainingAgent", "run_forward",
    "ORT prints a PythonOp's Python error and raises 'Get null result' for the node: a torch kernel's failure "
    "(ort_zero/ort/step/torch_kernels/failures.py) is raised as the step's error, naming the layer and what to pick",
    torch_kernels.raising_kernel_failure,
)  # fmt: skip
ort_patch(
    ORT, "ort.checkpoint_announcement", f"{GTM}:GraphTransitionManager", "_export_model",
    CHECKPOINT_POLICY + "ORT captures what is printed while it exports and shows it on rank 0 only: the announcement "
    "comes after the export",
    deferred(lambda: ort_zero_module("zero3.activation_checkpointing").announcing_after),
)  # fmt: skip

ort_patch(
    ORT, "ort.export_overrides", f"{ORTM}._custom_op_symbolic_registry:CustomOpSymbolicRegistry", "register_all",
    "torch's exporter with ORTModule's symbolics writes some aten ops in a form ORT 1.19.2 rejects (a LayerNorm "
    "without weight) or not at all (expm1): each ORTModule registers ORT's symbolics, then ort_zero's overrides "
    "(ort_zero/ort/export/overrides.py: each op, why, and the model types that need it). Registrations stay with "
    "torch's exporter until the next ORTModule registers ORT's again.",
    export_overrides.registering_overrides,
    registers=export_overrides.OVERRIDES,
)  # fmt: skip

# ORT's symbolic shape inference on graphs it gave up on (ort_zero/ort/ortmodule/shape_inference.py says where and why).
ort_patch(
    ORT, "ort.shape_inference_finite_values", "onnxruntime.tools.symbolic_shape_infer:SymbolicShapeInference",
    "_try_get_value",
    "ORT's symbolic shape inference converts every constant it follows to an int: an infinite one (a clamp's "
    "upper limit, in the Mamba-2 mixers) raised OverflowError; a value that is not finite is no shape: unknown",
    shape_inference.finite_values_only,
)  # fmt: skip
ort_patch(
    ORT, "ort.shape_inference_recursion", f"{GTM}:GraphTransitionManager", "_infer_shapes",
    "ORT's symbolic shape inference recursed beyond Python's default limit on the Mamba-2 mixers' scan: the limit "
    "is raised while it runs",
    shape_inference.with_deeper_recursion,
)  # fmt: skip


ort_patch(
    ORT, "ort.custom_gradients", f"{ORTM}._custom_gradient_registry:CustomGradientRegistry", "register_all",
    "ORT 1.19.2 has no gradient builder for some ops torch's exporter writes (CumSum): each ORTModule registers ORT's "
    "custom gradients, then ort_zero's (ort_zero/ort/export/gradients.py: each gradient, its math, and the model types "
    "that need it). ORT's C++ registry has no way to remove a definition: they stay registered after a revert.",
    export_gradients.registering_gradients,
    registers=export_gradients.GRADIENTS,
)  # fmt: skip

# What ORTModule prints (why each line goes: ort_zero/ort/ortmodule/console.py).
ort_patch(
    ORT, "ort.quiet_logger", f"{ORTM}.ortmodule", "configure_ortmodule_logger",
    "ORT warns on every ZeRO-3 export that the user asked not to deep-copy the model (ort_zero skips the copy on "
    "purpose) and prints its captured export log at warning level: the first goes, the second is DEBUG",
    console.quiet_logger,
)  # fmt: skip
ort_patch(
    ORT, "ort.quiet_wrapping", f"{ORTM}._utils", "check_for_name_collisions_and_bind_methods_to_ortmodule",
    "ORTModule reads every attribute of the model it wraps: a Hugging Face model's deprecated properties warn, and "
    "ORT warns that six of PreTrainedModel's methods collide with its own (ORTModule's apply to the wrapped model "
    "as transformers' do): both go; a collision with the user's own method is still warned of",
    console.quiet_wrapping,
)  # fmt: skip
ort_patch(
    ORT, "ort.feature_table", GEM, "_log_feature_stats",
    "ORT's feature table says 'ZeRO Stage3 Support: OFF' and names ORT's memory optimizer while ort_zero runs "
    "ZeRO-3 and its own recompute: not shown for a ZeRO-3 model",
    console.feature_table_unless_zero3,
)  # fmt: skip
ort_patch(
    ORT, "ort.graph_optimizers", f"{ORTM}.graph_optimizer_registry:GraphOptimizerRegistry", "optimize_all",
    "the complete forward+backward graph is only reachable here, before ORT builds the session: ort_zero's pass "
    "makes each module's backward read parameters gathered again for it instead of the forward's copies (ZeRO-3 "
    "memory). ORT's registry has no way to remove a registered optimizer, so it is wrapped rather than registered, "
    "which keeps the patch reversible.",
    deferred(lambda: ort_zero_module(TRAINING).graph_optimizers),
)  # fmt: skip
ort_patch(
    ORT, "ort.graph_built_by", f"{ORTM}._training_manager:TrainingManager", "_build_graph",
    "ORT's graph-optimizer registry is told only the model's class name: while a TrainingManager builds its graph "
    "ort_zero notes which, so the training-graph passes' buffer plans stay with that model (a model that falls "
    "back forgets its own, not every model's).",
    deferred(lambda: ort_zero_module(TRAINING).graph_built_by),
)  # fmt: skip


for _method in ("_initialize_graph_builder", "_build_graph"):
    ort_patch(
        ORT, f"ort.graph_refusals_named.{_method}", GEM, _method,
        "An op ORT's schemas, or its gradient's, do not take in the model's dtype stopped the graph's build in a "
        "traceback from inside ORT's graph builder (Type Error: Type 'tensor(bfloat16)' ... is invalid): it is one "
        "line naming the op, the module and the way out.",
        deferred(lambda: ort_zero_module(EXECUTION).ort_refusals_named),
    )  # fmt: skip

ort_patch(
    ORT, "ort.trim_after_forward", f"{ORTM}._execution_agent:TrainingAgent", "run_forward",
    "a forward leaves in glibc's heap what it did not keep for the backward (most activations under the layer-wise "
    "recompute: 0.6 GiB per rank on a 162M LLaMA at seq 1024), the first also the export's garbage (1.0 GiB): after "
    "each the heap's free pages go back to the OS.",
    footprint.trimmed_after_forward,
)  # fmt: skip

ort_patch(
    ORT, "ort.half_precision_inference_graph", f"{ORTM}._inference_manager:InferenceManager", "_build_graph",
    "ORT's graph-optimizer registry runs on training graphs only, and ORT 1.19.2's CPU provider has no bf16 kernel "
    "for most ops (Add, Mul, its fused RMSNorm): a bf16 model's no_grad forward stopped at session creation "
    "(NOT_IMPLEMENTED); its inference graph gets the training graph's float32 fallback for those nodes.",
    deferred(lambda: ort_zero_module(INFERENCE).graph_built),
)  # fmt: skip


# How ORTModule's managers create their session (`_create_execution_agent`), one wrapper per row, innermost first.
_TRAINING_AGENT = f"{ORTM}._training_manager:TrainingManager", "_create_execution_agent"
_INFERENCE_AGENT = f"{ORTM}._inference_manager:InferenceManager", "_create_execution_agent"
ort_patch(
    ORT, "ort.memory_optimizer_off_for_zero3", *_TRAINING_AGENT,
    "for a ZeRO-3 graph ORT's own memory optimizer (ORTMODULE_MEMORY_OPT_LEVEL/CONFIG) stays off: it cannot "
    "recompute through the bridges and its recompute reads forward-gathered parameters; ort_zero's recompute pass "
    "applies the level instead, and ORT's probe of it (a second session built at the first step only to list what it "
    "could recompute) is not built.",
    deferred(lambda: ort_zero_module(TRAINING).zero3_memory_optimizer_off),
)  # fmt: skip
ort_patch(
    ORT, "ort.footprint_trimmed", *_TRAINING_AGENT,
    "once the session exists what ORTModule keeps beyond its needs goes: its graph builder (it makes a new one for "
    "every build), the dead memory of its graphs' protobufs and the session's copy of the model bytes (measured: 37 "
    "+ 17 + 2 MiB per rank, small GPT with 16 blocks). On the CPU every step leaves more freed memory in glibc's heap "
    "under ORT than in PyTorch (1.2 vs 0.75 GiB per rank on a 162M LLaMA): after each backward, once ORTModule has "
    "dropped the run's state, its free pages go back to the OS.",
    deferred(lambda: ort_zero_module(TRAINING).footprint_trimmed),
)  # fmt: skip
_CUDA_REASON = (
    "when ORT's CUDA provider cannot load, ORT builds the session on the CPU provider and ORTModule trains a CUDA "
    "model on the CPU without a word; ort_zero refuses, naming what failed to load."
)
_PROFILE_REASON = (
    "with ORT_ZERO_ORT_PROFILE ORT writes a session's profile only when the session ends, which ORTModule's sessions "
    "did not before the interpreter exited: the file stayed empty; ort_zero ends each one at exit. The profile of the "
    "session ORT builds only to probe its memory optimizer, which runs nothing, is removed: it was a second file "
    "whenever it started a second earlier."
)
_NO_KERNEL_REASON = (
    "a node ORT's provider has no kernel for (an op in bf16 on the CPU) stopped the session's creation in a "
    "traceback from deep inside ORT: it is one line naming the op, the module and the way out."
)
for _manager, _agent in (("TrainingManager", _TRAINING_AGENT), ("InferenceManager", _INFERENCE_AGENT)):
    ort_patch(ORT, f"ort.cuda_provider_required.{_manager}", *_agent, _CUDA_REASON, cuda_provider_required)
    ort_patch(
        ORT, f"ort.profile_written_at_exit.{_manager}", *_agent, _PROFILE_REASON,
        deferred(lambda: ort_zero_module(EXECUTION).profile_written_at_exit),
    )  # fmt: skip
    ort_patch(
        ORT, f"ort.session_refusals_named.{_manager}", *_agent, _NO_KERNEL_REASON,
        deferred(lambda: ort_zero_module(EXECUTION).ort_refusals_named),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# Model outputs ORTModule's schema code cannot walk (ort_zero/ort/ortmodule/output_structures.py says why and how).
_OUTPUTS_REASON = (
    "ORTModule's output walk knows tensors, numbers, sequences and mappings only: a Hugging Face causal LM at its "
    "defaults (use_cache=True) returns a transformers DynamicCache and every export stopped with 'Unsupported "
    "flatten data type'. Where ORT's walk fails, torch's pytree walks the outputs and objects of plain attributes "
    "that hold tensors are taken apart"
)
ort_patch(
    ORT, "ort.outputs_of_any_structure", IO, "_extract_schema",
    _OUTPUTS_REASON + " (their tensors become graph outputs).",
    output_structures.extracting_any_structure,
)  # fmt: skip
ort_patch(
    ORT, "ort.outputs_rebuilt_from_any_structure", GTM, "unflatten_data_using_schema",
    _OUTPUTS_REASON + ", and put together again after every ORT run (ORT's own schemas are ORT's).",
    output_structures.rebuilding_any_structure,
)  # fmt: skip
