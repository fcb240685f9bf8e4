"""A restarted torchrun attempt must not read the process-group addresses of the attempt that died. torch only.

torchrun's agent serves one TCPStore for every attempt of a job, and a worker's `env://` group connects to it
without a per-attempt prefix (torch 2.15's `_create_c10d_store`: "We create a new TCPStore for every retry", which
the agent does not). Gloo publishes each rank's address there under its group's keys (`default_pg/0//cpu//0/<rank>`;
a subgroup's `default_pg/0//<name>//cpu//0/<rank>`) and never removes them: a restarted rank reads a dead peer's
address before the peer has written its new one and fails with "connectFullMesh failed ... Connection refused".
Once every rank of a group has connected its keys serve nothing, so ort_zero deletes them wherever it runs after
groups form (its `init_distributed`, `ORTZeroTrainer`, DeepSpeed's ZeRO-3 setup, the first agreed step end): the
next attempt finds no address but those its own ranks write, however the script started its group and whatever each
node's restart count.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

GROUP_KEYS = "default_pg/"  # torch's prefix for the keys of every process group started on the default store
STORE_TIMEOUT = timedelta(seconds=60)


def under_agent_store() -> bool:
    """Whether this process is a torchrun worker whose groups start on the agent's store, kept across attempts."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def forget_group_addresses() -> None:
    """Delete the keys of every process group formed so far from torchrun's agent store, once every rank has
    connected (a collective: every rank calls it at the same point). Nothing to do outside torchrun's agent."""
    if not (dist.is_available() and dist.is_initialized() and under_agent_store()):
        return
    dist.barrier()  # every rank has formed every group started so far: their addresses have been read
    if dist.get_rank() == 0:
        agent = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=STORE_TIMEOUT
        )
        for key in agent.list_keys():
            if GROUP_KEYS in key:
                agent.delete_key(key)
    dist.barrier()  # no rank writes a new group's address before rank 0 has listed the old ones
