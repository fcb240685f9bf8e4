"""How every ort_zero entry point ends its process group: a no-op without one; with one, the group is gone and
gloo's workers have had the GIL before the caller goes on (the exit-time abort this prevents is in
`ort_zero.distributed.shut_down_distributed`; measured by running the examples, not here)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from ort_zero.distributed import GLOO_DRAIN_SECONDS, shut_down_distributed


def test_without_a_process_group_it_does_nothing() -> None:
    assert not dist.is_initialized()
    shut_down_distributed()
    assert not dist.is_initialized()


def test_it_ends_the_process_group_after_the_last_collective(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    dist.all_reduce(torch.ones(4))  # a collective whose tensor Python drops at once, as DeepSpeed's often are

    began = time.perf_counter()
    shut_down_distributed()

    assert not dist.is_initialized()
    assert time.perf_counter() - began >= GLOO_DRAIN_SECONDS
