"""DeepSpeed's CPU allreduce leaves one 66 MiB file per rank in /dev/shm (memory) after every run, natively; a run
through ort_zero's entry points leaves none, even when a rank dies (`ort_zero.distributed`).

DeepSpeed makes the files when it is told that all ranks share the machine (`LOCAL_SIZE`, which its launcher sets),
so these runs go through the deepspeed launcher."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import deepspeed_cmd, free_port, run_launcher

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
SMALL = ["--seq-len", "16", "--d-model", "32", "--n-layer", "1", "--n-head", "2", "--steps", "3", "--no-ort"]
TIMEOUT = 300


def left_behind(port: int) -> list[Path]:
    """The allreduce files of the run on `port` still in /dev/shm."""
    return sorted(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_127.0.0.1_{port}_*"))


@pytest.mark.extended
def test_deepspeed_alone_leaves_its_files(tmp_path: Path) -> None:
    """What the other tests prove gone is there natively (else they would pass for nothing)."""
    port = free_port()
    script = SCRIPTS / "train_native_zero3.py"
    try:
        run_launcher(deepspeed_cmd(script, ["--steps", "2", "--out", str(tmp_path)], port=port), timeout=TIMEOUT)
        assert len(left_behind(port)) == 2
    finally:
        for path in left_behind(port):
            path.unlink()


def test_a_run_leaves_no_shared_memory(tmp_path: Path) -> None:
    port = free_port()
    config = ROOT / "ds_configs" / "zero3_cpu_fp32.json"
    argv = ["--deepspeed_config", str(config), "--output-dir", str(tmp_path), *SMALL]
    run_launcher(deepspeed_cmd(ROOT / "ort_zero" / "examples" / "train_gpt.py", argv, port=port), timeout=TIMEOUT)
    assert left_behind(port) == []


def test_a_dead_rank_leaves_no_shared_memory(tmp_path: Path) -> None:
    """The files go as soon as every rank has mapped them, before training: a rank that dies cannot keep them."""
    port = free_port()
    config = ROOT / "ds_configs" / "zero3_cpu_fp32.json"
    argv = ["--deepspeed_config", str(config), "--output-dir", str(tmp_path), *SMALL]
    result = run_launcher(deepspeed_cmd(SCRIPTS / "die_mid_run.py", argv, port=port), timeout=TIMEOUT, check=False)
    assert result.returncode != 0
    assert left_behind(port) == []
