#!/usr/bin/env bash
# ort_zero.examples.train_gpt under DeepSpeed's launcher; every argument is passed on to the trainer.
#
#   launch/deepspeed.sh --deepspeed_config ds_configs/zero3_cpu_fp32.json --steps 20 --output-dir runs/ds
#   NPROC=4 MASTER_PORT=29611 launch/deepspeed.sh --deepspeed_config ds_configs/zero3_cpu_fp32.json
#   HOSTFILE=launch/hostfile launch/deepspeed.sh --deepspeed_config ds_configs/zero3_gpu_bf16.json
#
# NPROC: ranks on this node (default 2). On a machine without GPUs DeepSpeed picks its CPU accelerator (or set
# DS_ACCELERATOR=cpu) and `--num_gpus N` starts N CPU processes. HOSTFILE: several nodes, one rank per slot (see
# launch/hostfile.example); NPROC is then ignored. MASTER_ADDR (with HOSTFILE), MASTER_PORT (default 29500).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -x "$ROOT/.venv/bin/python" ] || "$ROOT/launch/bootstrap.sh"

if [ -n "${HOSTFILE:-}" ]; then
    [ -f "$HOSTFILE" ] || { echo "launch/deepspeed.sh: HOSTFILE=$HOSTFILE does not exist" >&2; exit 2; }
    placement=(--hostfile "$HOSTFILE")
    if [ -n "${MASTER_ADDR:-}" ]; then placement+=(--master_addr "$MASTER_ADDR"); fi
else
    placement=(--num_gpus "${NPROC:-2}")
fi
exec "$ROOT/.venv/bin/deepspeed" "${placement[@]}" --master_port "${MASTER_PORT:-29500}" \
    --module ort_zero.examples.train_gpt "$@"
