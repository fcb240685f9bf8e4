"""The first step's prefetch from the exported module order (ort_zero/zero3/exported_order.py): DeepSpeed prefetches
nothing while it records its first step's trace; under ORT, whose export traced the modules' order before the first
run, each gather starts the next modules' (a fresh process per setting: scripts/first_step_prefetch.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

FIRST_STEP_PREFETCH = Path(__file__).parent / "scripts" / "first_step_prefetch.py"


@functools.cache
def trained(*flags: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"}
    done = subprocess.run(
        [sys.executable, str(FIRST_STEP_PREFETCH), *flags], env=env, capture_output=True, text=True, timeout=300,
        check=True,
    )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ort_ran"], result
    return result


def test_the_first_steps_gathers_are_prefetched_in_the_exported_order() -> None:
    prefetched = trained()["prefetched"]
    unprefetched = trained("--no-prefetch")["prefetched"]
    for direction in ("forward", "backward"):
        assert unprefetched[f"step1_{direction}"] == 0, unprefetched  # DeepSpeed's own: nothing while it records
        # all but what no earlier gather could start (in the backward, the LM head, released after its forward)
        assert prefetched[f"step1_{direction}"] >= 0.8, prefetched
        assert prefetched[f"step2_{direction}"] >= 0.8, prefetched  # from here on DeepSpeed's recorded trace


def test_the_prefetch_changes_no_number() -> None:
    assert trained()["losses"] == trained("--no-prefetch")["losses"]
