#!/usr/bin/env bash
# ort_zero.examples.train_gpt under torchrun (static rendezvous); every argument is passed on to the trainer.
#
#   DS_ACCELERATOR=cpu launch/torchrun.sh --deepspeed_config ds_configs/zero3_cpu_fp32.json --steps 20 --output-dir runs/tr
#   # two nodes, run once on each (NODE_RANK=0 on the node at MASTER_ADDR):
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 launch/torchrun.sh --deepspeed_config ...
#
# NPROC: ranks per node (default 2); NNODES (default 1); NODE_RANK (default 0); MASTER_ADDR (default 127.0.0.1);
# MASTER_PORT (default 29500). torchrun sets OMP_NUM_THREADS=1 per rank unless it is already set.
# ORT_ZERO_COLLECTIVE_TIMEOUT: seconds a collective waits for the other ranks before the trainer gives up (default
# 600); a rank that dies is noticed at once, this bounds a rank (or node) that hangs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -x "$ROOT/.venv/bin/python" ] || "$ROOT/launch/bootstrap.sh"

exec "$ROOT/.venv/bin/python" -m torch.distributed.run \
    --nproc_per_node "${NPROC:-2}" --nnodes "${NNODES:-1}" --node_rank "${NODE_RANK:-0}" \
    --master_addr "${MASTER_ADDR:-127.0.0.1}" --master_port "${MASTER_PORT:-29500}" \
    -m ort_zero.examples.train_gpt "$@"
