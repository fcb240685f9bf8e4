"""How every ort_zero entry point ends its process group: a no-op without one; with one, the group is gone and
gloo's workers have had the GIL before the caller goes on (the exit-time abort this prevents is in
`ort_zero.distributed.shut_down_distributed`; measured by tools/exit_stress.py, not here), and ends it at exit in a
script that does not."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import ort_zero
from ort_zero import distributed
from ort_zero.distributed import GLOO_DRAIN_SECONDS, shut_down_distributed
from ort_zero.tools.process_tree import free_port


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


# A rank's script that never ends its process group: world size 1 (gloo), started by init_distributed(); exit
# handlers registered before and after it report whether the group still exists when each runs.
EXITING_RANK = """
import atexit, sys
import torch.distributed as dist
atexit.register(lambda: print("registered before:", dist.is_initialized(), flush=True))
from ort_zero.distributed import init_distributed, shut_down_distributed
init_distributed()
atexit.register(lambda: print("registered after:", dist.is_initialized(), flush=True))
dist.barrier()
if sys.argv[1] == "shut-down":
    shut_down_distributed()
elif sys.argv[1] == "error":
    raise RuntimeError("a rank fails")
"""


def run_rank(how: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(free_port())
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ort_zero.__file__).parents[1]), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", EXITING_RANK, how], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("how", ["end", "shut-down", "error"])
def test_the_group_ends_at_exit_after_later_handlers_and_before_earlier_ones(how: str, tmp_path: Path) -> None:
    """Python runs exit handlers last-registered first: ort_zero's, registered by init_distributed(), runs after
    the script's later ones (the group still there for them) and before everything registered earlier (torch's
    and DeepSpeed's at import). After an explicit shut-down it has nothing to do; after an error it runs without
    a collective and the rank exits with the error's code."""
    done = run_rank(how, tmp_path)
    assert done.returncode == (1 if how == "error" else 0), done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("registered")]
    still_there = how != "shut-down"
    assert lines == [f"registered after: {still_there}", "registered before: False"], done.stdout


def test_enabling_registers_the_exit_shut_down_once(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Callable[[], None]] = []
    register = atexit.register

    def noting(handler: Callable[[], None]) -> Callable[[], None]:
        registered.append(handler)
        return handler if handler.__module__ == distributed.__name__ else register(handler)  # others' as usual

    monkeypatch.setattr(atexit, "register", noting)
    distributed.shut_down_at_exit.cache_clear()
    try:
        ort_zero.enable_zero3()
        ort_zero.enable_zero3()
        distributed.shut_down_at_exit()
    finally:
        ort_zero.disable_zero3()
        distributed.shut_down_at_exit.cache_clear()
    ours = [handler for handler in registered if handler.__module__ == distributed.__name__]
    assert len(ours) == 1
    ours[0]()  # without a process group: nothing to do
    assert not dist.is_initialized()


# DeepSpeed's ZeRO-3 collectives, called as its gathers and reduce-scatters call them, with Python's warning filters
# changing between steps as ORT's and ort_zero's `catch_warnings` blocks change them.
COLLECTIVE_STEPS = """
import sys, warnings, torch, torch.distributed as dist
import ort_zero
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
if sys.argv[1] == "enabled":
    ort_zero.enable_zero3()
for _ in range(5):
    dist.all_gather_into_tensor(torch.empty(4), torch.ones(4))
    dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
    warnings.warn("another warning", UserWarning)  # not ort_zero's: said as Python says it
dist.destroy_process_group()
"""


@pytest.mark.parametrize("how", ["enabled", "native"])
def test_the_deprecated_collectives_are_not_said_under_ort_zero(how: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(ort_zero.__file__).parents[1])])}
    done = subprocess.run(
        [sys.executable, "-c", COLLECTIVE_STEPS, how, str(tmp_path / "store")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = {
        name: done.stderr.count(f"`torch.distributed.{name}` is deprecated")
        for name in ("all_gather_into_tensor", "reduce_scatter_tensor")
    }
    deprecated = all(hasattr(getattr(dist, name), "__deprecated__") for name in said)  # torch 2.14: yes; 2.15: no
    assert said == dict.fromkeys(said, 5 if how == "native" and deprecated else 0), done.stderr[-3000:]
    assert done.stderr.count("UserWarning: another warning") == 5
