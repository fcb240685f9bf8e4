"""The linear layers' output pool (ort_zero/memory/output_pool.py): a buffer is handed out again only
once nothing else holds it; changing shapes do not grow it; in ORT, a step's forward writes into the memory the step
before used, so its pages are not faulted in again (a fresh process per setting: scripts/pool_faults.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ort_zero.memory.output_pool import OutputPool, _Buffer, pooled


def test_a_buffer_is_handed_out_again_only_once_released() -> None:
    pool = OutputPool()
    held = pool.take((4, 8), torch.float32)
    released = pool.take((4, 8), torch.float32)
    released_at, held_at = released.data_ptr(), held.data_ptr()
    assert released_at != held_at
    del released
    again = pool.take((4, 8), torch.float32)
    assert again.data_ptr() == released_at
    view = held[1:]  # a view holds the storage as the tensor did
    del held
    assert pool.take((4, 8), torch.float32).data_ptr() not in (held_at, released_at)
    assert view.data_ptr() == held_at + 8 * 4


def test_a_small_output_never_pins_a_large_buffer() -> None:
    pool = OutputPool()
    large = pool.take((64, 64), torch.float32).data_ptr()
    assert pool.take((8, 8), torch.float32).data_ptr() != large
    assert pool.take((40, 64), torch.float32).data_ptr() == large  # at least half of it: served
    assert pool.take((4, 8), torch.float64).dtype == torch.float64


def test_a_take_asks_only_the_buffers_of_sizes_that_could_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step holds hundreds of buffers (a bf16 162M LLaMA at seq 1024: 163, 726 takes a step); asking each whether
    it was free at every take cost 0.4-0.5 s a step. Held buffers of other sizes are not asked."""
    pool = OutputPool()
    held = [pool.take((64, 64), torch.float32) for _ in range(50)] + [pool.take((4, 4), torch.float32)]
    asked = []
    is_free = _Buffer.is_free
    monkeypatch.setattr(_Buffer, "is_free", lambda buffer: asked.append(buffer.capacity) or is_free(buffer))
    released = pool.take((16, 16), torch.float32)
    assert asked == [16]  # the one smaller buffer, held: nothing could serve, and nothing is replaced
    del released
    asked.clear()
    assert pool.take((15, 16), torch.float32).numel() == 240
    assert asked == [256]  # the buffer of its size class, free again, is the only one asked
    assert len(held) == 51


def test_changing_shapes_do_not_grow_the_pool() -> None:
    """Dynamic padding: every step's batch is longer than the last; the pool holds one step's buffers, not all."""
    pool = OutputPool()
    for rows in range(100, 2000, 100):
        outputs = [pool.take((rows, 32), torch.float32) for _ in range(3)]  # alive together, as a step's
        del outputs
        pool.end_step()
        assert pool.bytes() <= 3 * rows * 32 * 4, rows


def test_what_a_step_did_not_use_is_dropped_at_its_end() -> None:
    pool = OutputPool()
    kept = pool.take((16, 16), torch.float32)
    dropped = pool.take((16, 16), torch.float32)
    del dropped
    pool.end_step()  # the first step used both
    assert pool.bytes() == 2 * 16 * 16 * 4
    pool.end_step()  # the second used none: the free one goes, the held one stays
    assert pool.bytes() == 16 * 16 * 4
    assert kept.sum() is not None


def test_a_first_runs_buffers_are_dropped_at_its_end() -> None:
    """A session's first run holds more at once than a step does: its free buffers go, used or not."""
    pool = OutputPool()
    pool.session_built()
    held = pool.take((16, 16), torch.float32)
    pool.take((16, 16), torch.float32)
    pool.end_step()
    assert pool.bytes() == 16 * 16 * 4  # the held one stays
    pool.take((16, 16), torch.float32)
    pool.end_step()  # a later step keeps what it used
    assert pool.bytes() == 2 * 16 * 16 * 4
    assert held.sum() is not None


def test_the_pool_serves_only_plain_cpu_matmuls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORT_ZERO_OUTPUT_POOL", "1")
    like = torch.zeros(1)
    assert pooled((8, 8), like, like) is not None
    assert pooled((8, 8), like, torch.zeros(1, dtype=torch.float64)) is None  # mixed dtypes: torch's promotion
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert pooled((8, 8), like, like) is None
    monkeypatch.setenv("ORT_ZERO_OUTPUT_POOL", "0")
    assert pooled((8, 8), like, like) is None


def test_by_default_the_pool_serves_every_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 model's linear layers too: its step peaks in the forward, where their outputs are alive anyway."""
    monkeypatch.delenv("ORT_ZERO_OUTPUT_POOL", raising=False)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        like = torch.zeros(1, dtype=dtype)
        assert pooled((8, 8), like, like) is not None, dtype


POOL_FAULTS = Path(__file__).parent / "scripts" / "pool_faults.py"


@functools.cache  # one run per setting, shared by the tests that read it
def trained_with_pool(setting: str | None, dtype: str) -> dict:
    """The script's result with ORT_ZERO_OUTPUT_POOL set to `setting` (None: unset, the default)."""
    env = {**os.environ, "ORT_ZERO_TRIM_HEAP": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ORT_ZERO_OUTPUT_POOL", None)
    env.update({} if setting is None else {"ORT_ZERO_OUTPUT_POOL": setting})
    done = subprocess.run(
        [sys.executable, str(POOL_FAULTS), dtype], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ort_ran"] and any("LinearInTorch" in op for op in result["python_ops"]), result
    return result


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.extended)])  # CI's budget
def test_a_forward_reuses_the_last_steps_outputs_instead_of_faulting_them_in(dtype: str) -> None:
    """After each backward the heap's free pages go back to the OS; without the pool the next forward faulted the
    linear layers' outputs in again, page by page (in float32 ~3x the pages of the pool's forward). On by default."""
    if not sys.platform.startswith("linux"):
        pytest.skip("counts the process's minor page faults")
    pooled, unpooled = trained_with_pool(None, dtype), trained_with_pool("0", dtype)
    assert pooled["losses"] == pytest.approx(unpooled["losses"], rel=1e-6)
    assert pooled["losses"][2] < pooled["losses"][0]  # it trains
    spared = unpooled["forward_faults"] - pooled["forward_faults"]
    assert spared > 0.8 * pooled["linear_output_pages"], (pooled, unpooled)
    assert pooled["peak_rss_mib"] < unpooled["peak_rss_mib"] + 40, (pooled, unpooled)
