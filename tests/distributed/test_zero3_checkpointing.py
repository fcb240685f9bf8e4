"""Users' activation checkpointing under ZeRO-3 (2 CPU ranks, torchrun): torch.utils.checkpoint reentrant and
non-reentrant, and deepspeed.checkpointing.checkpoint, each on a fresh engine (scripts/run_zero3_checkpointing.py).

PyTorch path (ort_zero's hooks) against native DeepSpeed with the same checkpoints: same losses and parameters, and
the same recomputes, each finding its layer's parameters gathered again after the forward released them. In ORT
(fallback disabled, ORT session and bridges checked): at ORTMODULE_MEMORY_OPT_LEVEL=1 the checkpointed layers are
exported as plain calls and ort_zero's layer-wise recompute recomputes them, on native's curve, announced once per
rank; at level 0 every rank stops with one line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd
from parity import BRIDGES, assert_same_params

SCRIPT = Path(__file__).parent / "scripts" / "run_zero3_checkpointing.py"
KINDS = ["torch_reentrant", "torch_non_reentrant", "deepspeed"]
LAYERS, LEAVES, STEPS = 3, 3, 6  # as in the script: blocks, parameterised layers per block, steps
ANNOUNCEMENT = "ort_zero: gradient checkpointing runs in ONNX Runtime as ort_zero's layer-wise recompute"


def run(
    out: Path, mode: str, kinds: list[str], level: int | None = None, check: bool = True
) -> tuple[list[dict], subprocess.CompletedProcess[str]]:
    """(every rank's {kind: record}, the launcher's output) of one 2-rank launch."""
    args = ["--mode", mode, "--out", str(out), *(a for kind in kinds for a in ("--kind", kind))]
    env = {"ORTMODULE_MEMORY_OPT_LEVEL": str(level)} if level is not None else None
    done = run_launcher(
        torchrun_cmd(SCRIPT, args, port=free_port()), timeout=240, cwd=SCRIPT.parent, env=env, check=check
    )
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)] if done.returncode == 0 else []
    return ranks, done


def pairs(reference: list[dict], result: list[dict]) -> list[tuple[int, str, dict, dict]]:
    return [(rank, kind, reference[rank][kind], result[rank][kind]) for rank in range(2) for kind in KINDS]


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    ranks, _ = run(tmp_path_factory.mktemp("native"), "native", KINDS)
    for rank, records in enumerate(ranks):
        for kind, record in records.items():
            # what makes the comparison mean something: every block was recomputed in every step, its parameters
            # released after the forward and gathered again for the recompute; and the model learned
            assert len(record["recomputes"]) == LAYERS * LEAVES * STEPS, f"rank {rank}, {kind}"
            assert all(r["gathered"] for r in record["recomputes"]), f"rank {rank}, {kind}"
            assert all(record["released_after_forward"]), f"rank {rank}, {kind}"
            assert record["losses"][-1] < record["losses"][0] - 0.5, f"rank {rank}, {kind}: did not learn"
    return ranks


def test_pytorch_path_matches_native_with_each_checkpoint(tmp_path: Path, native: list[dict]) -> None:
    ranks, _ = run(tmp_path, "torch", KINDS)
    for rank, kind, expected, got in pairs(native, ranks):
        assert got["ort_zero_hooks"], f"rank {rank}, {kind}: ort_zero's hooks were not installed"
        assert got["recomputes"] == expected["recomputes"], f"rank {rank}, {kind}"
        assert got["released_after_forward"] == expected["released_after_forward"], f"rank {rank}, {kind}"
        assert got["losses"] == pytest.approx(expected["losses"], rel=0, abs=1e-6), f"rank {rank}, {kind}"
        if rank == 0:
            assert_same_params(expected["params"], got["params"], rtol=0.0, atol=1e-6)


def test_ort_at_level_1_recomputes_layer_wise_on_natives_curve(tmp_path: Path, native: list[dict]) -> None:
    ranks, done = run(tmp_path, "ort", KINDS, level=1)
    for rank, kind, expected, got in pairs(native, ranks):
        ort = got["ort"]
        assert ort["session"] and BRIDGES <= set(ort["python_ops"]), f"rank {rank}, {kind}: not run in ORT"
        recompute = ort.get("recompute") or {}
        assert recompute.get("level") == 1 and recompute.get("recomputed_nodes", 0) > 0, f"{kind}: {recompute}"
        layers = sorted(recompute["layers"])
        assert [p.rsplit(".", 2)[-2:] for p in layers] == [["layers", str(i)] for i in range(LAYERS)], layers
        assert got["losses"] == pytest.approx(expected["losses"], rel=1e-5, abs=1e-6), f"rank {rank}, {kind}"
        if rank == 0:
            assert_same_params(expected["params"], got["params"], rtol=1e-5, atol=1e-6)
    announcements = [line for line in done.stdout.splitlines() if ANNOUNCEMENT in line]
    assert len(announcements) == 2, announcements  # once per rank, on one line, though ORT exported 6 graphs each
    assert all("(ORTMODULE_MEMORY_OPT_LEVEL=1)" in line for line in announcements)
    assert "Layer-wise memory optimization is enabled" not in done.stdout, "ORT's own checkpoint wrapper acted"


def test_ort_at_level_0_stops_every_rank_with_one_line(tmp_path: Path) -> None:
    _, done = run(tmp_path, "ort", ["torch_reentrant"], level=0, check=False)
    assert done.returncode != 0
    for rank in (0, 1):
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"ort_zero: rank {rank}: ")]
        assert len(lines) == 1, done.stdout[-3000:]
        assert "torch.utils.checkpoint.checkpoint(use_reentrant=True)" in lines[0]
        assert "ORTMODULE_MEMORY_OPT_LEVEL=1" in lines[0] and "without ORTModule" in lines[0]
    for traceback_sign in (f'File "{SCRIPT}"', "ExportFailure", "ORTModuleONNXModelException", "CheckpointingRefused"):
        assert traceback_sign not in done.stdout, f"a traceback instead of the one line: {traceback_sign}"
