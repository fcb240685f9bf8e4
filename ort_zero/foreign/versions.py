"""The versions of each foreign package that ort_zero's patches and its reaches into private code were written for."""

DEEPSPEED_VERSIONS = ">=0.19.8,<0.20"
ORT_VERSIONS = "==1.19.2"
# What ort_zero builds ORT 1.19.2's torch extensions for (stack/extension_sources.py). Measured: 2.14.1, 2.15.0.
TORCH_VERSIONS = ">=2.13,<2.16"
# The transformers releases whose model code ort_zero rewrites for export (ort/export/rewrites/). Outside them a
# rewrite applies where the code it replaces is unchanged (foreign/fingerprints.py).
TRANSFORMERS_VERSIONS = ">=5.23,<5.25"
# TRL, whose trainers ort_zero runs in ORT (integrations/trl.py) and whose ZeRO-3 gather it adapts: 1.16.0 measured.
TRL_VERSIONS = ">=1.16,<1.17"

# The releases the test suites ran on (docs/stack.md); launch/constraints.txt installs the newest of each.
# `ort-zero doctor` says whether the installed ones are among them.
TESTED = {
    "torch": ("2.14.1", "2.15.0"),
    "onnxruntime-training": ("1.19.2",),
    "deepspeed": ("0.19.8",),
    "transformers": ("5.23.0", "5.24.0"),
    "accelerate": ("1.15.0",),
    "peft": ("0.21.2",),
    "trl": ("1.16.0",),  # optional: not in setup.py (docs/huggingface.md)
}
