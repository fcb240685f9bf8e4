#!/usr/bin/env bash
# ort_zero.examples.train_gpt under DeepSpeed's launcher; every argument is passed on to the trainer.
#
#   launch/deepspeed.sh --deepspeed_config ds_configs/zero3_cpu_fp32.json --steps 20 --output-dir runs/ds
#   NPROC=4 MASTER_PORT=29611 launch/deepspeed.sh --deepspeed_config ds_configs/zero3_cpu_fp32.json
#   HOSTFILE=launch/hostfile launch/deepspeed.sh --deepspeed_config ds_configs/zero3_gpu_bf16.json
#
# NPROC: ranks on this node (default 2). On a machine without GPUs DeepSpeed picks its CPU accelerator (or set
# DS_ACCELERATOR=cpu) and `--num_gpus N` starts N CPU processes. HOSTFILE: one rank per slot (see
# launch/hostfile.example); NPROC is then ignored. With several hosts DeepSpeed starts the ranks through pdsh/ssh;
# a hostfile with one host runs here without ssh (DeepSpeed would otherwise check `ssh <host>` first and, without
# MASTER_ADDR, ask that host for its address over ssh), with MASTER_ADDR defaulting to 127.0.0.1.
# MASTER_ADDR (with HOSTFILE), MASTER_PORT (default 29500). ORT_ZERO_COLLECTIVE_TIMEOUT: seconds a collective waits
# for the other ranks (default 600); on several nodes put it in ~/.deepspeed_env.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -x "$ROOT/.venv/bin/python" ] || "$ROOT/launch/bootstrap.sh"

if [ -n "${HOSTFILE:-}" ]; then
    [ -f "$HOSTFILE" ] || { echo "launch/deepspeed.sh: HOSTFILE=$HOSTFILE does not exist" >&2; exit 2; }
    placement=(--hostfile "$HOSTFILE")
    hosts="$(grep -cvE '^[[:space:]]*(#|$)' "$HOSTFILE" || true)"  # DeepSpeed skips comments and blank lines too
    if [ "$hosts" -eq 1 ]; then
        placement+=(--no_ssh_check --master_addr "${MASTER_ADDR:-127.0.0.1}")
    elif [ -n "${MASTER_ADDR:-}" ]; then
        placement+=(--master_addr "$MASTER_ADDR")
    fi
else
    placement=(--num_gpus "${NPROC:-2}")
fi
exec "$ROOT/.venv/bin/deepspeed" "${placement[@]}" --master_port "${MASTER_PORT:-29500}" \
    --module ort_zero.examples.train_gpt "$@"
