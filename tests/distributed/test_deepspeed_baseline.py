"""Native DeepSpeed ZeRO-3 (no ort_zero) on 2 CPU ranks through each real launcher.

If this fails, nothing built on it can pass: it checks the stack, gloo, the launchers and the harness. Data-parallel
ZeRO-3 over 2 ranks must reproduce plain single-process PyTorch on the whole global batch, step by step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import deepspeed_cmd, free_port, mpirun_cmd, read_rank_results, run_launcher, torchrun_cmd

SCRIPT = Path(__file__).parent / "scripts" / "train_native_zero3.py"
STEPS = 8
TIMEOUT = 300


def command(launcher: str, out: Path) -> tuple[list[str], dict[str, str]]:
    args = ["--steps", str(STEPS), "--out", str(out)]
    port = free_port()
    if launcher == "deepspeed":
        return deepspeed_cmd(SCRIPT, args, nproc=2, port=port), {}
    if launcher == "torchrun":
        return torchrun_cmd(SCRIPT, args, nproc=2, port=port), {}
    return mpirun_cmd(SCRIPT, args, np=2), {"MASTER_PORT": str(port)}


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun", "mpirun"])
def test_native_zero3_trains_on_two_cpu_ranks(tmp_path: Path, launcher: str) -> None:
    argv, env = command(launcher, tmp_path)
    run_launcher(argv, timeout=TIMEOUT, env=env, cwd=tmp_path)
    ranks = read_rank_results(tmp_path)

    for rank, result in enumerate(ranks):
        assert (result["rank"], result["world_size"]) == (rank, 2)
        assert (result["zero_stage"], result["accelerator"], result["backend"]) == (3, "cpu", "gloo")
        assert result["partitioned"], "parameters were not partitioned: this was not ZeRO-3"
    launched_by = {
        "deepspeed": [r["local_rank_arg"] for r in ranks] == [0, 1],
        "torchrun": all("TORCHELASTIC_RUN_ID" in r["launcher_env"] for r in ranks),
        "mpirun": [r["launcher_env"].get("OMPI_COMM_WORLD_RANK") for r in ranks] == ["0", "1"],
    }
    assert launched_by[launcher], f"the ranks do not look launched by {launcher}: {ranks}"

    first, second = ranks
    assert len(first["losses"]) == STEPS
    assert first["losses"] == second["losses"], "ranks disagree on the global loss"
    assert first["local_losses"] != second["local_losses"], "both ranks trained on the same rows"
    assert first["param_checksum"] == second["param_checksum"], "ranks gathered different parameters"
    assert first["losses"][-1] < 0.5 * first["losses"][0], f"the loss did not fall: {first['losses']}"
    assert first["losses"] == pytest.approx(first["reference_losses"], rel=1e-5), "ZeRO-3 differs from plain PyTorch"
