"""The versions of each foreign package that ort_zero's patches and its reaches into private code were written for."""

DEEPSPEED_VERSIONS = ">=0.19.8,<0.20"
ORT_VERSIONS = "==1.19.2"
# What ort_zero builds ORT 1.19.2's torch extensions for (stack/extension_sources.py). Measured: 2.14.1 (pinned);
# 2.15.0 builds the same sources.
TORCH_VERSIONS = ">=2.13,<2.16"
# The transformers release whose model code ort_zero rewrites for export (ort/export_rewrites/): the one pinned.
TRANSFORMERS_VERSIONS = ">=5.23,<5.24"
# TRL, whose trainers ort_zero runs in ORT (integrations/trl.py) and whose ZeRO-3 gather it adapts: 1.16.0 measured.
TRL_VERSIONS = ">=1.16,<1.17"
