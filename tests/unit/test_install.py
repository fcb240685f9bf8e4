"""`pip install -e .[hf]` into an environment that already has versions of the stack within setup.py's ranges keeps
them: pip's resolver, asked for a dry run against this venv (CI's: launch/constraints.txt's versions), would
install ort_zero and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STACK = ("torch", "onnxruntime-training", "deepspeed", "transformers", "accelerate", "peft")


def would_install(*requirements: str) -> dict[str, str]:
    """What `pip install` of `requirements` would install into this venv: name -> version (a dry run, with this
    venv's setuptools building ort_zero's metadata)."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-build-isolation", "--report", "-"]
    result = subprocess.run([*command, *requirements], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in report["install"]}


def test_installing_ort_zero_keeps_the_installed_stack() -> None:
    installed = {name: version(name) for name in STACK}
    assert would_install("-e", f"{ROOT}[hf]") == {"ort_zero": version("ort_zero")}, installed


def test_the_dry_run_sees_a_replacement() -> None:
    """The check is not blind: asking for another `packaging` than the installed one shows up as an install."""
    other = would_install("-e", f"{ROOT}[hf]", f"packaging!={version('packaging')}")
    assert set(other) == {"ort_zero", "packaging"} and other["packaging"] != version("packaging")
