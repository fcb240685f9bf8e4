"""benchmarks/bench_zero3.py on CUDA GPUs: native and ORT-ZeRO3 both report the GPU allocator's peak on every rank.
Skipped where there is no GPU (CI); written for GPU hosts and never run (docs/stack.md, "GPU hosts").

ORT-ZeRO3 runs with ort_zero enabled, so an ORT session that fell back to the CPU provider fails the run instead of
being measured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_zero3.py"


def test_benchmark_reports_gpu_peaks_per_rank() -> None:
    nproc = min(2, torch.cuda.device_count())
    command = [sys.executable, str(BENCH), "--configs", "native-z3", "ort-z3", "--steps", "3", "--warmup", "2",
               "--nproc", str(nproc)]  # fmt: skip
    env = dict(os.environ, DS_ACCELERATOR="cuda")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200, cwd=BENCH.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|") for line in result.stdout.splitlines() if line.startswith("| ")}
    gpu_column = rows["config"].index(" GPU peak MiB ")
    for config in ("native-z3", "ort-z3"):
        peaks = [float(peak) for peak in rows[config][gpu_column].split("/")]
        assert len(peaks) == nproc and all(peak > 0 for peak in peaks), rows[config]
