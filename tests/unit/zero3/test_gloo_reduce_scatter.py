"""Which of DeepSpeed's reduce-scatter calls ort_zero does as an all-reduce in place: only a synchronous one on gloo
whose output is this rank's own chunk of a contiguous CPU input; every other goes to DeepSpeed's as it was called.
(Values and page faults on 2 ranks: tests/distributed/test_gloo_reduce_scatter.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ort_zero.distributed import shut_down_distributed
from ort_zero.zero3.gloo_reduce_scatter import in_place_on_gloo


@pytest.fixture
def one_rank_gloo(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    shut_down_distributed()


@pytest.fixture
def deepspeeds_calls() -> list[tuple[Any, ...]]:
    return []


@pytest.fixture
def reduce_scatter(deepspeeds_calls: list[tuple[Any, ...]]) -> Any:
    def deepspeeds(input_tensor: torch.Tensor, output_tensor: torch.Tensor, group: Any = None, **kwargs: Any) -> str:
        deepspeeds_calls.append((input_tensor, output_tensor, kwargs))
        return "deepspeed's"

    return in_place_on_gloo(deepspeeds)


def test_the_ranks_own_chunk_is_all_reduced_in_place(
    one_rank_gloo: None, reduce_scatter: Any, deepspeeds_calls: list
) -> None:
    bucket = torch.arange(8.0)

    assert reduce_scatter(bucket, bucket.chunk(1)[0]) is None

    assert deepspeeds_calls == []
    assert torch.equal(bucket, torch.arange(8.0))  # the sum over one rank


@pytest.mark.parametrize("case", ["separate output", "asynchronous", "strided input"])
def test_anything_else_is_deepspeeds(
    one_rank_gloo: None, reduce_scatter: Any, deepspeeds_calls: list, case: str
) -> None:
    bucket = torch.arange(16.0).view(4, 4).t() if case == "strided input" else torch.arange(16.0)
    output = torch.empty(16) if case == "separate output" else bucket
    kwargs = {"async_op": True} if case == "asynchronous" else {}

    assert reduce_scatter(bucket, output, **kwargs) == "deepspeed's"

    assert len(deepspeeds_calls) == 1 and deepspeeds_calls[0][2] == kwargs
