"""One rank of the reduce-scatter test: DeepSpeed's gradient reduce-scatter (`reduce_scatter_coalesced`) on gloo, as
DeepSpeed runs it and with ort_zero's in-place all-reduce, on the same gradients: the values each gives this rank and
the pages each call faulted in after the heap's free pages went back to the OS (as they do after every backward)."""

from __future__ import annotations

import argparse
import resource
import statistics
from pathlib import Path

import torch
from deepspeed.runtime.comm.coalesced_collectives import reduce_scatter_coalesced
from rank_run import finish, start, write_result

from ort_zero import patches
from ort_zero.memory.heap import give_back_freed_memory

PAGE = resource.getpagesize()
BUCKETS = {  # as DeepSpeed's gradient buckets hand them over: one gradient, or several of odd sizes (padded)
    "one gradient": [(3072, 768)],
    "several": [(1000, 3), (2049,), (512, 1024)],
}


def gradients(shapes: list[tuple[int, ...]], rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    return [torch.randn(shape, generator=generator) for shape in shapes]


def reduced(shapes: list[tuple[int, ...]], rank: int) -> tuple[list[torch.Tensor], int]:
    """This rank's partitions of the bucket, and the pages the call faulted in."""
    grads = gradients(shapes, rank)
    give_back_freed_memory()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    partitions = reduce_scatter_coalesced(grads)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return [p.clone() for p in partitions], faults


def median_faults(shapes: list[tuple[int, ...]], rank: int, calls: int = 5) -> tuple[list[torch.Tensor], int]:
    """The partitions of the first call, and the median of the pages the `calls` calls faulted in."""
    runs = [reduced(shapes, rank) for _ in range(calls)]
    return runs[0][0], statistics.median_low(faults for _, faults in runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=None)
    args = parser.parse_args()
    rank = start("native")  # ort_zero's zero3 patches are applied around one of the two calls only
    import deepspeed

    deepspeed.init_distributed("gloo")
    result = {}
    for name, shapes in BUCKETS.items():
        reduced(shapes, rank)  # gloo's own buffers for this size and each collective, made once
        with patches.applied("zero3"):
            reduced(shapes, rank)
        # the median of five calls each: now and then a call finds the pages it needs at hand, or faults in more
        native, native_faults = median_faults(shapes, rank)
        with patches.applied("zero3"):
            in_place, in_place_faults = median_faults(shapes, rank)
        result[name] = {
            "equal": all(torch.equal(a, b) for a, b in zip(native, in_place, strict=True)),
            "input_pages": sum(-(-g.numel() * g.element_size() // PAGE) for g in gradients(shapes, rank)),
            "native_faults": native_faults,
            "in_place_faults": in_place_faults,
        }
    write_result(args.out, rank, result)
    finish()


if __name__ == "__main__":
    main()
