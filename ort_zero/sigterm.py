"""SIGTERM as a request to stop that every rank agrees on at a step boundary, instead of each rank dying (or saving)
where the signal happens to find it. Used by the examples' loops and by the Trainer integration
(integrations/preemption.py); torch only.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from .restarts import forget_group_addresses


class StopRequest:
    """SIGTERM noted on this rank; `agreed()`, called by every rank at the same step boundary, says whether any rank
    has it. The handler does nothing but note the signal: the rank stops where `agreed()` tells it to. Once the ranks
    have agreed to stop, SIGTERM is ignored for the rest of the process: a later one (the scheduler reaching this rank
    after another) must not cut the save or the exit short; the launcher's SIGKILL after its grace period still ends
    the process."""

    def __init__(self) -> None:
        self.signalled = self.stopping = self._first_step_seen = False
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        """Handle SIGTERM from now on (call from the main thread, as Python's `signal` requires)."""
        if not self._installed:
            self._previous = signal.signal(signal.SIGTERM, self._note)
            self._installed = True

    def uninstall(self) -> None:
        """Give SIGTERM back to the handler it had before `install`, unless the ranks are stopping on it."""
        if self._installed and not self.stopping:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def __enter__(self) -> StopRequest:
        self.install()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.uninstall()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True

    def agreed(self) -> bool:
        """Whether any rank has been sent SIGTERM: one all-reduce of a flag (a collective: every rank calls it at the
        same step boundary, from the main thread). At the first, every group of the run has formed (the engine's
        too): under torchrun their addresses leave the agent's store (ort_zero/restarts.py)."""
        if not self._first_step_seen:
            self._first_step_seen = True
            forget_group_addresses()
        stop = self.signalled
        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([int(stop)], dtype=torch.int32, device=collective_device())
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        if stop and not self.stopping:
            self.stopping = True
            if self._installed:  # ignored from now on (SIG_IGN also outlasts the interpreter's own shutdown)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return stop


def collective_device() -> torch.device:
    """Where a small tensor for a collective lives: the current GPU under nccl, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
