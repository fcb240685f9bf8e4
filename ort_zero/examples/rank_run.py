"""What both examples need to run as one rank of many: their usage errors, the threads per rank, how long a
collective waits for the other ranks, and how a rank that lost contact with the others reports it."""

from __future__ import annotations

import math
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ort_zero import python_op
from ort_zero.distributed import init_distributed

TIMEOUT_ENV = "ORT_ZERO_COLLECTIVE_TIMEOUT"  # seconds a collective waits for the other ranks
DEFAULT_TIMEOUT_S = 600.0
LOST_CONTACT_EXIT = 1


class UsageError(ValueError):
    """Arguments that cannot work together; reported as one line and exit code 2."""


def configure_threads() -> None:
    """Share this machine's cores among the ranks on it; several ranks with all cores each oversubscribe the CPU."""
    if "OMP_NUM_THREADS" in os.environ:
        return  # torch already follows it
    # torchrun, the deepspeed launcher and Open MPI each name the number of ranks on this node differently.
    names = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")
    local_ranks = next((int(os.environ[name]) for name in names if os.environ.get(name)), 1)
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_ranks))


def collective_timeout() -> timedelta:
    """How long a collective waits for the other ranks before it fails: a rank that hangs (as opposed to one that
    dies, which gloo notices at once) ends the run after this instead of blocking the others forever."""
    value = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {value!r}")
    return timedelta(seconds=seconds)


def lost_contact(error: RuntimeError) -> bool:
    """Whether a collective failed because another rank is gone or stuck: gloo's transport errors (peer closed the
    connection, send/recv timed out) and torch's distributed errors (NCCL watchdog, store), also when raised inside
    ORT's graph (a PythonOp's gather: ORT's error hides it, `python_op.cause_of` finds it). Anything else is a bug
    whose traceback must be shown."""
    cause = python_op.cause_of(error)
    return isinstance(cause, dist.DistError) or "gloo/transport/" in str(cause)


def report_lost_contact(program: str, error: RuntimeError, rank: int, step: int | None) -> None:
    """One line on stderr: which rank lost contact, when, and the transport's own words."""
    where = f"during step {step}" if step is not None else "outside the training steps"
    cause = python_op.cause_of(error)
    detail = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
    print(
        f"{program}: error (rank {rank}): lost contact with another rank {where} ({detail}); "
        "a rank died or the network failed",
        file=sys.stderr,
        flush=True,
    )


def start_process_group(program: str, timeout: timedelta) -> tuple[int, int]:
    """`init_distributed`; a rank that cannot reach the others while the group forms (a peer gone, a restarted
    attempt's peer that never came) says so in one line and exits 1 instead of showing gloo's traceback."""
    try:
        return init_distributed(timeout)
    except RuntimeError as error:
        if not lost_contact(error):
            raise
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        rank = os.environ.get("RANK", "?")
        print(
            f"{program}: error (rank {rank}): could not start the process group with the other ranks ({detail})",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(LOST_CONTACT_EXIT) from None
