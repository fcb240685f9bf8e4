"""What is replaced only while ORTModule exports a ZeRO-3 model: torch ops and model code ONNX cannot express,
attention, experts, linear layers and the loss as torch's kernels, autograd Functions ORT cannot run as they are, and
users' checkpoints. Which groups an export enters: `ort_zero.ort.export.groups.during_export`."""

from __future__ import annotations

from ..foreign import deepspeed as ds_internals
from ..ort.export import autograd as export_autograd
from ..ort.export import context as export_context
from ..ort.export import promotion_casts as export_promotion_casts
from ..ort.export import python_ops as export_python_ops
from ..ort.export import rewrites as export_rewrites
from ..ort.export import tuples as export_tuples
from ..ort.step import torch_kernels
from ..patch_groups import (
    EXPORT_AUTOGRAD_FUNCTIONS,
    EXPORT_PYTHON_OPS,
    ORT_EXPORT,
    TORCH_KERNELS,
    TORCH_KERNELS_EXPERTS,
)
from .declare import (
    ORTM,
    declared,
    deepspeed_patch,
    deferred,
    ort_patch,
    ort_zero_module,
    torch_patch,
    transformers_patch,
)

deepspeed_patch(
    ORT_EXPORT, "deepspeed.parameter_reads_in_export", "deepspeed.runtime.zero.parameter_offload:ZeROOrderedDict",
    "__getitem__",
    "DeepSpeed registers a parameter read outside its module's forward as an external parameter at the first eager "
    "access, which an export never makes (its stand-ins are available): while the export's trace runs, such reads "
    "are noted and registered the same way, and the model traced again (zero3/external_params.py).",
    deferred(lambda: ort_zero_module("zero3.external_params").noting_reads),
)  # fmt: skip


deepspeed_patch(
    ORT_EXPORT, "deepspeed.memory_efficient_linear_in_export", "torch.nn.functional", "linear",
    "zero.Init leaves F.linear as DeepSpeed's LinearFunctionForZeroStage3, an autograd Function that saves "
    "the weight it is given: traced into an ORT graph it keeps every gathered weight alive until the backward "
    "and runs each Linear in PyTorch through a PythonOp. While ORTModule exports a ZeRO-3 model, F.linear is "
    "torch's own, so Linear layers become ORT's Gemm/MatMul and the backward re-gathers their weights.",
    ds_internals.torch_linear_behind_zero3_wrap,
)  # fmt: skip
torch_patch(
    ORT_EXPORT, "torch.onnx_shape_inference_without_stand_ins", "torch._C",
    "_jit_pass_onnx_graph_shape_type_inference",
    "the TorchScript exporter hands its whole-graph shape inference every parameter, which keeps a dense "
    "copy of each as a constant value: for a ZeRO-3 export, whose parameters are stand-ins that cost no memory, "
    "the whole model on every rank. While ORTModule exports a ZeRO-3 model the pass gets every parameter but "
    "the stand-ins (their shapes are in the graph's input types).",
    export_context.shape_inference_without_stand_ins,
)  # fmt: skip
torch_patch(
    ORT_EXPORT, "torch.bfloat16_promotion_casts", "torch._C", "_jit_pass_onnx_scalar_type_analysis",
    "torch's exporter writes an implicit promotion to bfloat16 (a bf16 tensor times an int64 mask: Mamba and the "
    "other state-space and linear-attention types) as Cast(to=15), torch's number for bfloat16 and ONNX's for "
    "complex128, which ORT refuses: while ORTModule exports a ZeRO-3 model such Casts get ONNX's bfloat16 "
    "(ort_zero/ort/export/promotion_casts.py)",
    export_promotion_casts.bfloat16_promotion_casts,
)  # fmt: skip
torch_patch(
    ORT_EXPORT, "torch.bfloat16_promoted_outputs", "torch._C", "_jit_pass_onnx_node_shape_type_inference",
    "the same number mix-up in the exporter's per-node inference: an op mixing a bool and a bf16 tensor "
    "(RecurrentGemma's `reset + ~reset * multiplier`) gets a ComplexDouble output, and the next op fails with "
    "'ScalarType ComplexDouble is an unexpected tensor scalar type': while ORTModule exports a ZeRO-3 model such "
    "outputs are typed bfloat16 (ort_zero/ort/export/promotion_casts.py)",
    export_promotion_casts.bfloat16_promoted_outputs,
)  # fmt: skip
torch_patch(
    ORT_EXPORT, "torch.lower_unread_bridge_tuples", "torch._C", "_jit_pass_lower_all_tuples",
    "a bridge returns its module's tensors as one tuple; where nothing reads them (types "
    f"{', '.join(export_tuples.MODEL_TYPES)}) the tracer drops the unpack but keeps the PythonOp, and torch's tuple "
    "lowering stops the export (Couldn't lower all tuples): while ORTModule exports a ZeRO-3 model each such tuple "
    "gets an unpack nothing reads, and is flattened like the others (ort_zero/ort/export/tuples.py)",
    export_tuples.lowering_unread_tuples,
)  # fmt: skip

for _method in ("scatter", "scatter_"):
    torch_patch(
        ORT_EXPORT, f"torch.{_method}_value_in_export", "torch:Tensor", _method,
        "torch's TorchScript exporter fails an internal assert (alias analysis) on a scatter of a Python bool (the "
        "DeepSeek-V3.2-style sparse attention's mask): while ORTModule exports a ZeRO-3 model, the bool is scattered "
        "as the int 0 or 1 (the same values in a bool tensor)",
        export_rewrites.int_and_bool_ops.scatter_bool_value_as_int,
    )  # fmt: skip

# Model code ONNX cannot express, rewritten while a model that runs it is exported (ort_zero/ort/export/rewrites/).
for _rewrite in export_rewrites.REWRITES:
    for _declaration in _rewrite.declarations():
        declared(_rewrite.group, _declaration)

# Torch ops ORT cannot export or differentiate, run by torch in PythonOps while a ZeRO-3 model is exported
# (ort_zero/ort/export/python_ops.py: each op, why, and the model types that need it).
for _op in export_python_ops.PYTHON_OPS:
    declared(EXPORT_PYTHON_OPS, _op)

# Attention and experts as torch's own kernels in PythonOps while a ZeRO-3 model is exported
# (ort_zero/ort/step/torch_kernels/: what each saves, and how the layer-wise recompute re-runs them).
torch_patch(
    TORCH_KERNELS, "torch.sdpa_as_fused_kernel", "torch.nn.functional", "scaled_dot_product_attention",
    "torch's exporter writes scaled_dot_product_attention as MatMul + Softmax: ORT then keeps a heads x seq x seq "
    "probability tensor per layer for the backward (seq^2 memory); run by torch's fused kernel in a PythonOp, only "
    "its output and log-sum-exp are kept (and nothing, under the layer-wise recompute)",
    torch_kernels.sdpa_in_torch,
)  # fmt: skip
torch_patch(
    TORCH_KERNELS, "torch.cross_entropy_in_torch", "torch.nn.functional", "cross_entropy",
    "ORT 1.19.2's CPU SoftmaxCrossEntropyLoss takes 3x torch's time on a causal LM's logits ([1024, 32000]: 0.48 vs "
    "0.16 s, one thread): a language model's loss runs as torch's log-softmax and NLL loss in a PythonOp",
    torch_kernels.cross_entropy_in_torch,
)  # fmt: skip
torch_patch(
    TORCH_KERNELS, "torch.linear_as_torch_matmul", "torch.nn:Linear", "forward",
    "ORT 1.19.2's CPU MatMul takes 1.26-1.34x torch's time on a LLaMA-160M's linear layers at seq 1024 (one thread), "
    "and at long sequences a step is matmuls (ORT-ZeRO3's step 1.26x native's): nn.Linear runs as torch's matmuls in "
    "a PythonOp, on the module's own ZeRO-3 parameters",
    torch_kernels.linear_in_torch,
)  # fmt: skip
torch_patch(
    TORCH_KERNELS, "torch.silu_in_torch", "torch.nn.functional", "silu",
    "ORT 1.19.2's CPU provider has no 16-bit kernel for the QuickGelu it fuses SiLU into: a bf16 MLP's activation "
    "and its gradient ran in float32 between Casts (0.5 s of an 18 s step, 162M, seq 1024): a 16-bit SiLU on the "
    "CPU runs as torch's silu in a PythonOp, in the model's dtype",
    torch_kernels.silu_in_torch,
)  # fmt: skip
torch_patch(
    TORCH_KERNELS, "torch.product_in_torch", "torch:Tensor", "__mul__",
    "ORT 1.19.2's CPU provider has no 16-bit Mul: a bf16 model's products ran in float32 between Casts, the MLP's "
    "act_fn(gate) * up and its gradient 0.6 s of an 18 s step (162M, seq 1024): a product of two 16-bit "
    "activations (no parameter: a norm's weight stays in ORT's fused RMSNorm) on the CPU runs as torch's mul in a "
    "PythonOp, in the model's dtype",
    torch_kernels.product_in_torch,
)  # fmt: skip
torch_patch(
    TORCH_KERNELS, "torch.sum_in_torch", "torch:Tensor", "__add__",
    "ORT 1.19.2's CPU provider has no 16-bit Add: a bf16 model's residual and rotary sums ran in float32 between "
    "Casts: a sum of two 16-bit activations on the CPU runs as torch's add in a PythonOp, in the model's dtype",
    torch_kernels.sum_in_torch,
)  # fmt: skip
torch_patch(
    TORCH_KERNELS, "torch.negation_in_torch", "torch:Tensor", "__neg__",
    "ORT 1.19.2's CPU provider has no 16-bit Neg: a bf16 model's rotary negations and their gradients ran in float32 "
    "between Casts (0.07 s of a 6 s step, 162M, seq 1024): the negation of a 16-bit activation on the CPU runs as "
    "torch's neg in a PythonOp, in the model's dtype",
    torch_kernels.negation_in_torch,
)  # fmt: skip
torch_patch(
    TORCH_KERNELS, "torch.rms_norm_in_torch", "torch.nn:Module", "_slow_forward",
    "ORT 1.19.2's CPU provider runs the SimplifiedLayerNormalization it fuses transformers' RMSNorm into in float32 "
    "only: a bf16 model's norms and their gradients ran between Casts (0.3-0.5 s of a 9.5 s step, 162M, seq 1024). "
    "transformers writes an RMSNorm class per model family, so the call is caught where every module's call goes "
    "while torch traces it: a 16-bit RMSNorm of LLaMA's form on the CPU runs as torch's ops in a PythonOp, in the "
    "model's dtypes",
    torch_kernels.rms_norm_in_torch,
)  # fmt: skip
transformers_patch(
    TORCH_KERNELS_EXPERTS, "transformers.experts_in_torch", "transformers.integrations.moe:ExpertsInterface",
    "get_interface",
    "transformers' experts implementations cannot be exported as they run: grouped_mm (the default) counts tokens "
    "per expert with torch.histc (no symbolic), eager loops over the routed experts in Python (the trace keeps one "
    "batch's routing), batched_mm copies every expert's weights per (token, expert) pair (3.7x native's memory at "
    "87M): the chosen implementation runs in torch in a PythonOp, its backward by torch's autograd",
    torch_kernels.experts_in_torch, ("mixture-of-experts",),
)  # fmt: skip

# Users' checkpoints while a ZeRO-3 model is exported (why and how: ort_zero/zero3/activation_checkpointing.py).
CHECKPOINT_POLICY = (
    "ORT cannot run a checkpoint: under ZeRO-3 it runs directly at ORTMODULE_MEMORY_OPT_LEVEL 1/2 (ort_zero's "
)
CHECKPOINT_POLICY += "layer-wise recompute does its job), and stops the run with one line at 0. "
torch_patch(
    ORT_EXPORT, "torch.checkpoint_in_export", "torch.utils.checkpoint:CheckpointFunction", "apply",
    CHECKPOINT_POLICY + "every reentrant call arrives here, however checkpoint was bound",
    deferred(lambda: ort_zero_module("zero3.activation_checkpointing").torch_checkpoint_apply),
)  # fmt: skip
deepspeed_patch(
    ORT_EXPORT, "deepspeed.checkpoint_in_export",
    "deepspeed.runtime.activation_checkpointing.checkpointing:CheckpointFunction", "apply",
    CHECKPOINT_POLICY + "every call arrives here, however checkpoint was bound",
    deferred(lambda: ort_zero_module("zero3.activation_checkpointing").deepspeed_checkpoint_apply),
)  # fmt: skip
ort_patch(
    ORT_EXPORT, "ort.checkpoint_wrappers_in_export", ORTM, "ORTMODULE_ONNX_EXPORT_CONTEXT",
    CHECKPOINT_POLICY + "ORT's checkpoint wrappers run the function (and print) at level 1 while this flag says an "
    "export runs; a fresh [False] (read nowhere else) makes them hand every call on",
    lambda replaced: [False],
)  # fmt: skip

# Autograd Functions of model and library code (TRL's, PhiMoE's, Reformer's, users'), exported while a ZeRO-3 model is
# exported as PythonOps ORT can run: tensor outputs only, one gradient per input (ort_zero/ort/export/autograd.py).
torch_patch(
    EXPORT_AUTOGRAD_FUNCTIONS, "torch.autograd_function_with_tensor_outputs_in_export",
    "torch.autograd.function:Function", "apply",
    "ORT 1.19.2's PythonOp takes tensor outputs only and one gradient per input, present for each input it "
    "differentiates; PyTorch lets a Function return None or numbers (TRL's ChunkedLogProbFunction), None gradients "
    "(PhiMoE) and extra trailing Nones (Reformer). While ORTModule exports a ZeRO-3 model every Function but "
    "ort_zero's and ORT's own runs through a wrapper with tensor outputs (constants back to the caller, checked at "
    "each run) and one gradient per input (zeros for None)",
    export_autograd.applying_with_tensor_outputs,
)  # fmt: skip
