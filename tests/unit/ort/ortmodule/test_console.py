"""What ORTModule prints under ort_zero (`ort_zero.ort.ortmodule.console`): its records ort_zero makes obsolete are
dropped or demoted, everything else passes; importing ORT after ort_zero prints nothing on a machine without CUDA."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from ort_zero.ort.ortmodule import console


def record(message: str, name: str = "orttraining.rank-0") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, None)


def test_the_deep_copy_warning_goes_and_other_warnings_stay() -> None:
    records = console.OrtRecords()
    assert not records.filter(record(f"{console.NOT_DEEP_COPIED}, the initial weights may not be preserved"))
    assert records.filter(record("Due to the limited GPU memory execution manager does not create a deep copy"))
    assert records.filter(record("Fallback to PyTorch due to exception ..."))


@pytest.mark.parametrize(
    "message",
    [
        "[export] Filtered logs (95 records suppressed):\n    a line torch printed",
        "Fast path enabled - skipping checks. rebuild gradient graph: True, execution agent recreation: True",
    ],
)
def test_ort_notes_are_debug(message: str) -> None:
    captured = record(message, "ort_zero.test")
    logging.getLogger("ort_zero.test").setLevel(logging.WARNING)
    assert not console.OrtRecords().filter(captured)
    assert captured.levelno == logging.DEBUG
    logging.getLogger("ort_zero.test").setLevel(logging.DEBUG)
    assert console.OrtRecords().filter(record("[export] Filtered logs (1 records suppressed):", "ort_zero.test"))


def test_importing_ort_after_ort_zero_prints_nothing() -> None:
    code = "import ort_zero; import onnxruntime.training.ortmodule; import torch.utils.cpp_extension"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    printed = [line for line in (child.stdout + child.stderr).splitlines() if "Setting accelerator to CPU" not in line]
    assert printed == []
