"""The launch scripts as users run them: each of launch/*.sh starts 2 CPU ranks of the example trainer, which trains.

A tiny model and 2 steps: these check the scripts' wiring (placement, rendezvous, environment), not the numbers
(test_train_gpt_native.py does). `--no-ort`/`--native` keep ORT's export out of the run time (ORT is tested
elsewhere). Every run gets a free port through MASTER_PORT, as a user would set it when 29500 is taken.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from launcher import Launch, free_port, run_launcher

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
CONFIGS = ROOT / "ds_configs"
SMALL = ["--seq-len", "16", "--d-model", "32", "--n-layer", "1", "--n-head", "2", "--steps", "2"]
TIMEOUT = 300  # seconds for a whole run; about 30-70 s on a busy 2-core machine


def trainer_args(config: str, out: Path, *mode: str) -> list[str]:
    return ["--deepspeed_config", str(CONFIGS / config), "--output-dir", str(out), *SMALL, *mode]


def assert_trained(out: Path) -> None:
    """Rank 0's record of a 2-rank run: both steps with finite losses."""
    with (out / "losses.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == [0, 1], rows
    assert all(math.isfinite(float(row["loss"])) for row in rows), rows
    assert json.loads((out / "args.json").read_text())["world_size"] == 2


def test_deepspeed_script_with_a_single_host_hostfile(tmp_path: Path) -> None:
    """One host in the hostfile: the ranks start here, with neither ssh nor pdsh (this machine has no sshd)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# this machine only\nlocalhost slots=2\n")
    out = tmp_path / "out"
    argv = [str(LAUNCH / "deepspeed.sh"), *trainer_args("zero3_offload_cpu.json", out, "--no-ort")]
    env = {"HOSTFILE": str(hostfile), "MASTER_PORT": str(free_port())}
    run_launcher(argv, timeout=TIMEOUT, env=env, cwd=ROOT)
    assert_trained(out)


def test_torchrun_script_as_two_nodes(tmp_path: Path) -> None:
    """Two torchrun agents with one rank each meet at node 0's port, as on two machines; ZeRO-2 in plain DeepSpeed."""
    out = tmp_path / "out"
    argv = [str(LAUNCH / "torchrun.sh"), *trainer_args("zero2_cpu_fp32.json", out, "--native")]
    common = {"NNODES": "2", "NPROC": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    # One rank per "node" would take all cores each (LOCAL_WORLD_SIZE=1); both nodes share this machine's cores.
    common["OMP_NUM_THREADS"] = "1"
    with (
        Launch(argv, env={**common, "NODE_RANK": "0"}, cwd=ROOT) as node0,
        Launch(argv, env={**common, "NODE_RANK": "1"}, cwd=ROOT) as node1,
    ):
        node0.finish(timeout=TIMEOUT)
        node1.finish(timeout=60)  # the rendezvous ends together: node 1 is done when node 0 is
    assert_trained(out)


def test_mpirun_script_with_gradient_accumulation(tmp_path: Path) -> None:
    """Ranks found through mpi4py; the config accumulates 2 micro-batches per step."""
    out = tmp_path / "out"
    argv = [str(LAUNCH / "mpirun.sh"), *trainer_args("zero3_grad_accum.json", out, "--no-ort")]
    run_launcher(argv, timeout=TIMEOUT, env={"MASTER_PORT": str(free_port())}, cwd=ROOT)
    assert_trained(out)
