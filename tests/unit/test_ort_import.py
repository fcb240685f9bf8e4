"""`import ort_zero` changes nothing; the first import of ONNX Runtime after it prepares ORT and its switch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# Looked up without importing it: this process must not import ONNX Runtime before ort_zero (other tests rely on it).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="needs onnxruntime-training")

PROBE = """
import json, sys, warnings
import ort_zero
from ort_zero import patches
def state():
    return {"ort_imported": "onnxruntime" in sys.modules, "torch_onnx": patches.is_applied("torch.onnx.jit_utils"),
            "zero3": ort_zero.is_zero3_enabled(), "filters": len(warnings.filters)}
at_import = state()
from onnxruntime.training.ortmodule import ORTModule
import onnxruntime
after_ort = state()
after_ort["loader"] = type(onnxruntime.__spec__.loader).__name__
print(json.dumps({"at_import": at_import, "after_ort": after_ort}))
"""


def probe(**env: str) -> dict:
    environment = {key: value for key, value in os.environ.items() if key != "ORTMODULE_ENABLE_ZERO_STAGE3"}
    child = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env={**environment, **env}, timeout=300
    )
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_import_changes_nothing_and_the_first_ort_import_prepares() -> None:
    result = probe()
    assert result["at_import"] == {**result["at_import"], "ort_imported": False, "torch_onnx": False, "zero3": False}
    assert result["after_ort"]["torch_onnx"], "ORTModule was imported without the torch.onnx names it needs"
    assert result["after_ort"]["filters"] > result["at_import"]["filters"], "ORT's import-time notes were not filtered"
    assert not result["after_ort"]["zero3"], "ort_zero enabled itself without being asked"
    assert result["after_ort"]["loader"] == "SourceFileLoader", "onnxruntime kept ort_zero's loader"


def test_orts_switch_enables_ort_zero_when_ort_is_imported() -> None:
    result = probe(ORTMODULE_ENABLE_ZERO_STAGE3="1")
    assert not result["at_import"]["zero3"], "import ort_zero read the environment"
    assert result["after_ort"]["zero3"]
