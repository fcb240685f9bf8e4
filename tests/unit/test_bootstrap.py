"""launch/bootstrap.sh on an installed venv: one line per step, and its install stamp covers setup.py and
launch/constraints.txt (a changed version in either re-installs)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"


@pytest.fixture
def bootstrapped() -> None:
    if Path(sys.prefix).resolve() != VENV.resolve():
        pytest.skip(f"runs in the venv launch/bootstrap.sh builds ({VENV}), not {sys.prefix}")


def test_a_second_run_prints_one_line_per_step(bootstrapped: None) -> None:
    result = subprocess.run([str(ROOT / "launch" / "bootstrap.sh")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == f"[bootstrap] stack already installed in {VENV}", result.stderr
    assert lines[1].startswith("[bootstrap] ORTModule's torch C++ extensions") and "cpu: " in lines[1]
    assert lines[-1] == f"[bootstrap] ready: {VENV}" and len(lines) <= 4, result.stderr
    assert result.stdout == ""


def test_the_install_stamp_hashes_setup_py_and_the_constraints(bootstrapped: None) -> None:
    pinned = (ROOT / "setup.py").read_bytes() + (ROOT / "launch" / "constraints.txt").read_bytes()
    assert (VENV / ".ort_zero-installed").read_text().strip() == hashlib.sha256(pinned).hexdigest()[:16]
