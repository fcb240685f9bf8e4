#!/usr/bin/env bash
# The main job: a 2-rank DeepSpeed ZeRO-3 run of the small GPT in PyTorch and in ONNX Runtime, compared step by step.
#   launch/converge.sh [ort-zero converge options]     e.g. --steps 50 --nproc 2
#   launch/converge.sh --memory-opt-level 1            # the ORT run with ort_zero's layer-wise recompute
# Writes runs/converge/report.md and runs/converge/losses.png; exits non-zero when the curves disagree.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/bootstrap.sh"
cd "$ROOT"
export DS_ACCELERATOR="${DS_ACCELERATOR:-$("$ROOT/.venv/bin/python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
exec "$ROOT/.venv/bin/ort-zero" converge "$@"
