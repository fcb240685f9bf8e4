"""What a user sees when a 2-rank run cannot work: a clear message, a non-zero exit, and no waiting for ever.

A rank that dies mid-run (scripts/die_mid_run.py: rank 1 `os._exit(17)` at step 2) must end the run within a bound
under torchrun (one node, and two "nodes" where the survivor has to notice by itself) and under mpirun, with output
that names the failing rank. A rank that hangs instead ends the run after ORT_ZERO_COLLECTIVE_TIMEOUT. Configs that
cannot work end the run before training, with the checker's message.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from launcher import Launch, free_port, mpirun_cmd, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
CONFIGS = ROOT / "ds_configs"
DIE_MID_RUN = Path(__file__).resolve().parent / "scripts" / "die_mid_run.py"
SMALL = ["--seq-len", "16", "--d-model", "32", "--n-layer", "1", "--n-head", "2", "--steps", "4"]
TIMEOUT = 300  # seconds for a whole run, start-up included; about 30-70 s on a busy 2-core machine
# A collective waits this long for a silent peer; gloo notices a dead one at once, so this only bounds the worst case.
COLLECTIVE_TIMEOUT_S = 30
NOTICE_BOUND_S = 60  # from the rank's death to the launcher's exit: the collective timeout plus teardown
HANG_TIMEOUT_S = 15  # where a hung rank is the test: short, yet the ranks start well within it of each other
# What rank 1 prints when it dies (or hangs), with the time: the tests measure from there.
DEATH = re.compile(r"die_mid_run: rank 1 (?:exits with 17|hangs) at step 2, time (\d+\.\d+)")
TORCHRUN_NAMES_RANK_1 = re.compile(r"rank\s*:\s*1 \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*17\b")
# Open MPI 5 names a process [<job>,<rank>]: "Process name: [prterun-host-123@1,1]" is rank 1.
MPIRUN_NAMES_RANK_1 = re.compile(r"Process name:\s*\[[^\]]*,1\]\s*\n\s*Exit code:\s*17\b")
SURVIVOR_MESSAGE = "train_gpt: error (rank 0): lost contact with another rank during step 2"


def dying_args(out: Path, mode: str = "--no-ort") -> list[str]:
    config = CONFIGS / "zero3_cpu_fp32.json"
    return ["--deepspeed_config", str(config), "--output-dir", str(out), *SMALL, mode]


def seconds_since_death(result: subprocess.CompletedProcess[str]) -> float:
    """Seconds from rank 1's death (the time it printed just before) to now, the launcher having just exited."""
    now = time.time()
    death = DEATH.search(result.stdout)
    assert death, f"rank 1 did not reach step 2:\n{result.stdout[-4000:]}"
    return now - float(death.group(1))


def assert_failed_in_time(result: subprocess.CompletedProcess[str], seconds: float, what: str) -> None:
    assert result.returncode != 0, f"{what} exited 0 after a rank died:\n{result.stdout[-4000:]}"
    assert seconds < NOTICE_BOUND_S, f"{what} took {seconds:.1f}s to exit after the death:\n{result.stdout[-4000:]}"
    print(f"{what}: exit {seconds:.1f}s after rank 1 died")


@pytest.mark.extended  # the default set: test_surviving_node_reports_the_lost_rank, one torchrun agent per rank
def test_torchrun_stops_when_a_rank_dies(tmp_path: Path) -> None:
    argv = torchrun_cmd(DIE_MID_RUN, dying_args(tmp_path), port=free_port())
    env = {"ORT_ZERO_COLLECTIVE_TIMEOUT": str(COLLECTIVE_TIMEOUT_S)}
    result = run_launcher(argv, timeout=TIMEOUT, env=env, cwd=ROOT, check=False)
    assert_failed_in_time(result, seconds_since_death(result), "torchrun")
    assert TORCHRUN_NAMES_RANK_1.search(result.stdout), result.stdout[-4000:]


# CI time: the native run is in the extended set; the ORT run, where the loss is noticed inside a PythonOp, stays
@pytest.mark.parametrize("mode", [pytest.param("--no-ort", marks=pytest.mark.extended), "--ort"])
def test_surviving_node_reports_the_lost_rank(tmp_path: Path, mode: str) -> None:
    """Two torchrun agents, one rank each: nobody kills rank 0 for us, it must notice the loss and say so itself. In
    ORT the loss is noticed inside a PythonOp's gather: the same line, not ORT's "Get null result" traceback (what ORT's
    C++ prints before Python regains control stays: the gather's own traceback and its "Get null result" lines)."""
    port = free_port()
    env = {"ORT_ZERO_COLLECTIVE_TIMEOUT": str(COLLECTIVE_TIMEOUT_S), "OMP_NUM_THREADS": "1"}

    def node(rank: int) -> Launch:
        argv = torchrun_cmd(DIE_MID_RUN, dying_args(tmp_path, mode), port=port, nproc=1, nnodes=2, node_rank=rank)
        return Launch(argv, env=env, cwd=ROOT)

    with node(0) as node0, node(1) as node1:
        dead = node1.finish(timeout=TIMEOUT, check=False)
        assert_failed_in_time(dead, seconds_since_death(dead), "torchrun, node of the dead rank")
        survivor = node0.finish(timeout=NOTICE_BOUND_S, check=False)
        assert_failed_in_time(survivor, seconds_since_death(dead), "torchrun, node of the survivor")
    assert TORCHRUN_NAMES_RANK_1.search(dead.stdout), dead.stdout[-4000:]
    assert f"{SURVIVOR_MESSAGE} (" in survivor.stdout, survivor.stdout[-4000:]
    assert "; a rank died or the network failed" in survivor.stdout
    assert "Error in forward pass execution" not in survivor.stdout, survivor.stdout[-4000:]  # ORT's traceback
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)\s*\n\s*exitcode\s*:\s*1\b", survivor.stdout), survivor.stdout[
        -4000:
    ]


@pytest.mark.parametrize("mode", ["--no-ort", pytest.param("--ort", marks=pytest.mark.extended)])
def test_collective_timeout_ends_a_hung_run(tmp_path: Path, mode: str) -> None:
    """Rank 1 stops answering: rank 0 gives up after ORT_ZERO_COLLECTIVE_TIMEOUT and says so; torchrun ends the run.
    In ORT rank 0 waits inside a PythonOp's gather: the same line."""
    argv = torchrun_cmd(DIE_MID_RUN, dying_args(tmp_path, mode), port=free_port())
    env = {"ORT_ZERO_COLLECTIVE_TIMEOUT": str(HANG_TIMEOUT_S), "DIE_MID_RUN_HANG": "1"}
    result = run_launcher(argv, timeout=TIMEOUT, env=env, cwd=ROOT, check=False)
    seconds = seconds_since_death(result)
    assert_failed_in_time(result, seconds, "torchrun, hung rank")
    assert seconds >= HANG_TIMEOUT_S, "rank 0 gave up before the collective timeout"
    assert f"{SURVIVOR_MESSAGE} (" in result.stdout and "Timed out" in result.stdout, result.stdout[-4000:]


def test_mpirun_stops_when_a_rank_dies(tmp_path: Path) -> None:
    env = {"ORT_ZERO_COLLECTIVE_TIMEOUT": str(COLLECTIVE_TIMEOUT_S), "MASTER_PORT": str(free_port())}
    result = run_launcher(
        mpirun_cmd(DIE_MID_RUN, dying_args(tmp_path)), timeout=TIMEOUT, env=env, cwd=ROOT, check=False
    )
    assert_failed_in_time(result, seconds_since_death(result), "mpirun")
    assert MPIRUN_NAMES_RANK_1.search(result.stdout), result.stdout[-4000:]


def test_world_size_not_dividing_the_batch(tmp_path: Path) -> None:
    config = json.loads((CONFIGS / "zero3_cpu_fp32.json").read_text())
    config.pop("train_micro_batch_size_per_gpu")
    config["train_batch_size"] = 3
    path = tmp_path / "batch3.json"
    path.write_text(json.dumps(config))
    argv = [str(LAUNCH / "torchrun.sh"), "--deepspeed_config", str(path), "--output-dir", str(tmp_path), "--no-ort"]
    result = run_launcher(argv, timeout=120, env={"MASTER_PORT": str(free_port())}, cwd=ROOT, check=False)
    assert result.returncode != 0
    assert f"{path}: train_batch_size 3 is not divisible by the world size 2" in result.stdout, result.stdout[-4000:]
    assert not (tmp_path / "losses.csv").exists()


def test_missing_config(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    argv = [str(LAUNCH / "mpirun.sh"), "--deepspeed_config", str(missing), "--output-dir", str(tmp_path)]
    result = run_launcher(argv, timeout=120, env={"MASTER_PORT": str(free_port())}, cwd=ROOT, check=False)
    assert result.returncode != 0
    assert f"train_gpt: error: DeepSpeed config not found: {missing}" in result.stdout, result.stdout[-4000:]


def test_zero2_config_needs_native(tmp_path: Path) -> None:
    config = CONFIGS / "zero2_cpu_fp32.json"
    argv = [str(LAUNCH / "deepspeed.sh"), "--deepspeed_config", str(config), "--output-dir", str(tmp_path), "--no-ort"]
    result = run_launcher(argv, timeout=120, env={"MASTER_PORT": str(free_port())}, cwd=ROOT, check=False)
    assert result.returncode != 0
    assert "zero_optimization.stage is 2, but ort_zero needs ZeRO stage 3" in result.stdout, result.stdout[-4000:]
