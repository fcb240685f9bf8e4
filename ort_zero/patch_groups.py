"""The names of ort_zero's patch groups: which patches apply together, and when. `ort_zero.patches` declares each
group's patches; `ort_zero.patching` applies a group by one of these names and refuses a name no patch declares."""

TORCH_ONNX = "torch_onnx"  # when ONNX Runtime is first imported: ORTModule importable on today's torch (`ort_import`)
ZERO3 = "zero3"  # enable_zero3(): DeepSpeed's ZeRO-3 hooks, its gloo reduce-scatter, its checkpoint saving (`api`)
ORT = "ort"  # enable_zero3() once ORT is imported: ORTModule's export, graph, session and console (`api`)
TRL = "trl"  # an ORTZeroTrainer created with TRL imported (`integrations.hf_trainer`)

# Only while ORTModule exports a ZeRO-3 model (`ort.export.groups.during_export`), beside each model rewrite's own
# group (its `ModelRewrite.group`, `ort.export.rewrites`).
ORT_EXPORT = "ort_export"
EXPORT_AUTOGRAD_FUNCTIONS = "export_autograd_functions"
EXPORT_PYTHON_OPS = "export_python_ops"
TORCH_KERNELS = "torch_kernels"
TORCH_KERNELS_EXPERTS = "torch_kernels_experts"  # where transformers' MoE code is loaded
