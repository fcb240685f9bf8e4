"""Environment and markers shared by every test.

The variables are set in `pytest_configure`, before any test module is imported, because DeepSpeed picks its
accelerator at import time and ORTModule reads its fallback policy when a module is wrapped. Child processes started
by the distributed harness inherit them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ENVIRONMENT = {
    "DS_ACCELERATOR": "cpu",  # CPU-only machines: gloo, DeepSpeed's CPU accelerator
    "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE",  # an ORT failure must fail the test, not run PyTorch silently
    # DeepSpeed 0.19.8 decorates a function with torch.compile at import (zero/muon), which starts torch inductor's
    # pool of compile workers in every rank: two more torch imports per rank on a 2-core machine, and workers that
    # outlive their rank keep mpirun waiting on their output pipes.
    "TORCH_WARM_POOL": "0",
    # every graph pass is checked to edit the graph only as it declares (ort_zero/ort/passes/contract.py)
    "ORT_ZERO_CHECK_PASSES": "1",
}
SHARED_MEMORY, DEEPSPEED_ALLREDUCE_FILES = Path("/dev/shm"), "deepspeed_allreduce_buffer_*"
MARKERS = {TESTS / "unit": "unit", TESTS / "distributed": "distributed"}
_saved: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    for name, value in ENVIRONMENT.items():
        _saved[name] = os.environ.get(name)
        os.environ[name] = value


def pytest_unconfigure(config: pytest.Config) -> None:
    for name, value in _saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--extended",
        action="store_true",
        help="also run the tests marked `extended` (README, Tests: what runs by default and what only with this)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by folder, so `-m unit` / `-m distributed` select them without per-file decorators; leave the
    extended set out unless --extended asks for it (deselected, so a default run reports no skips for it)."""
    for item in items:
        for folder, marker in MARKERS.items():
            if item.path.is_relative_to(folder):
                item.add_marker(marker)
    if config.getoption("--extended"):
        return
    extended = [item for item in items if item.get_closest_marker("extended")]
    if extended:
        config.hook.pytest_deselected(items=extended)
        items[:] = [item for item in items if not item.get_closest_marker("extended")]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return TESTS.parent


@pytest.fixture(autouse=True)
def no_shared_memory_left() -> Iterator[None]:
    """Runs that do not go through ort_zero's entry points (native DeepSpeed) leave DeepSpeed's CPU allreduce files
    in /dev/shm: 66 MiB of memory per rank each, which would pile up over the suite. What a test left goes after it."""
    before = set(SHARED_MEMORY.glob(DEEPSPEED_ALLREDUCE_FILES))
    yield
    for path in set(SHARED_MEMORY.glob(DEEPSPEED_ALLREDUCE_FILES)) - before:
        path.unlink(missing_ok=True)
