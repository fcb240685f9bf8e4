"""ort_zero.examples.train_gpt end to end: 2 CPU ranks under torchrun, the GPT on the stdlib corpus.

Native DeepSpeed ZeRO-3 (the reference) learns and resumes from a checkpoint onto the same loss curve; the ORT path
(the demo's default) follows the native curve; an ORT checkpoint resumes in PyTorch and converts, with DeepSpeed's
zero_to_fp32.py, into a state dict for the plain GPT.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launcher import free_port, remount, run_launcher, tmpfs, torchrun_cmd

from ort_zero.data import load_corpus, sample_batch
from ort_zero.models import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "ort_zero" / "examples" / "train_gpt.py"
CONFIG = ROOT / "ds_configs" / "zero3_cpu_fp32.json"
SMALL = ["--seq-len", "32", "--d-model", "64", "--n-layer", "2", "--n-head", "4", "--seed", "7"]
STEPS = 6
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}


def assert_ran_in_ort(out: Path) -> None:
    """The trainer's ort.json: rank 0's training graph ran in an ORT session with ort_zero's bridges in it."""
    training = json.loads((out / "ort.json").read_text())["training"]
    assert training["session"] and BRIDGES <= set(training["python_ops"]), training


def train(out: Path, *args: str, config: Path = CONFIG, timeout: float = 400) -> list[dict[str, float]]:
    """Run the trainer on 2 ranks; the rows of its losses.csv. The launcher's output is appended to out/launcher.log."""
    argv = ["--deepspeed_config", str(config), "--output-dir", str(out), *SMALL, *args]
    result = run_launcher(torchrun_cmd(TRAINER, argv, port=free_port(), nproc=2), timeout=timeout, cwd=ROOT)
    with (out / "launcher.log").open("a") as log:
        log.write(result.stdout)
    with (out / "losses.csv").open(newline="") as handle:
        return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(handle)]


def losses(rows: list[dict[str, float]]) -> list[float]:
    return [row["loss"] for row in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, float]]]:
    out = tmp_path_factory.mktemp("straight")
    return out, train(out, "--native", "--steps", str(STEPS))


def test_native_run_writes_its_record_and_learns(straight: tuple[Path, list[dict[str, float]]]) -> None:
    out, rows = straight
    assert [int(row["step"]) for row in rows] == list(range(STEPS))
    assert all(math.isfinite(row["loss"]) and row["time_ms"] > 0 for row in rows)
    assert rows[0]["loss"] == pytest.approx(math.log(256), abs=0.5)  # an untrained byte model is near uniform
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3, f"the loss did not fall: {losses(rows)}"
    recorded = json.loads((out / "args.json").read_text())
    assert recorded["world_size"] == 2 and recorded["native"] and not recorded["ort"]


@pytest.mark.extended
def test_resumed_run_continues_the_same_curve(tmp_path: Path, straight: tuple[Path, list[dict[str, float]]]) -> None:
    _, reference = straight
    first = train(tmp_path, "--native", "--steps", str(STEPS // 2), "--save-every", str(STEPS // 2))
    assert (tmp_path / "checkpoints" / "latest").is_file()
    resumed = train(tmp_path, "--native", "--steps", str(STEPS), "--resume")
    assert losses(first) == pytest.approx(losses(reference)[: STEPS // 2], abs=1e-6)
    assert [int(row["step"]) for row in resumed] == list(range(STEPS))
    assert losses(resumed) == pytest.approx(losses(reference), abs=1e-6)


def test_ort_path_follows_the_native_curve(tmp_path: Path, straight: tuple[Path, list[dict[str, float]]]) -> None:
    """The default mode: ORTModule with ort_zero's ZeRO-3 hooks (fallback to PyTorch disabled by conftest)."""
    _, reference = straight
    rows = train(tmp_path, "--ort", "--steps", str(STEPS), timeout=500)
    assert json.loads((tmp_path / "args.json").read_text())["ort_zero_enabled"]
    assert_ran_in_ort(tmp_path)
    assert losses(rows) == pytest.approx(losses(reference), rel=1e-5, abs=1e-6)


def small_gpt() -> GPT:
    """The plain (no DeepSpeed, no ORT) GPT of the SMALL runs."""
    options = dict(zip(SMALL[::2], SMALL[1::2], strict=True))
    return GPT(
        GPTConfig(n_layer=int(options["--n-layer"]), n_head=int(options["--n-head"]),
                  d_model=int(options["--d-model"]), max_seq=int(options["--seq-len"]))
    )  # fmt: skip


@torch.no_grad()
def loss_at(model: GPT, step: int, world_size: int = 2) -> float:
    """The loss train_gpt logs at `step` for these weights: the mean over ranks and micro-batches (no dropout)."""
    config = json.loads(CONFIG.read_text())
    micro, accumulation = config["train_micro_batch_size_per_gpu"], config.get("gradient_accumulation_steps", 1)
    options = dict(zip(SMALL[::2], SMALL[1::2], strict=True))
    seed, seq_len, corpus = int(options["--seed"]), int(options["--seq-len"]), load_corpus()
    model.eval()
    total = 0.0
    for slot in range(world_size * accumulation):  # the step's global batch, whatever the ranks and accumulation
        batch = sample_batch(seed, step, slot, world_size * accumulation, micro, seq_len, corpus)
        total += model(**batch)["loss"].double().item()
    return total / (accumulation * world_size)


def test_ort_checkpoint_resumes_in_pytorch_and_converts_to_the_plain_model(
    tmp_path: Path, straight: tuple[Path, list[dict[str, float]]]
) -> None:
    """Save in ORT, resume with ort_zero's hooks in PyTorch, then zero_to_fp32.py gives the plain GPT its weights."""
    _, reference = straight
    half = STEPS // 2
    train(tmp_path, "--ort", "--steps", str(half), "--save-every", str(half), timeout=500)
    assert_ran_in_ort(tmp_path)
    ort_record = (tmp_path / "ort.json").stat().st_mtime_ns
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == f"global_step{half}"
    resumed = train(tmp_path, "--no-ort", "--steps", str(STEPS), "--resume")
    assert (tmp_path / "ort.json").stat().st_mtime_ns == ort_record, "the --no-ort run wrote an ORT record"
    assert [int(row["step"]) for row in resumed] == list(range(STEPS))
    assert losses(resumed) == pytest.approx(losses(reference), rel=1e-5, abs=1e-6)

    # What users run: the script DeepSpeed copies next to the checkpoint.
    script = checkpoints / "zero_to_fp32.py"
    assert script.is_file(), sorted(p.name for p in checkpoints.iterdir())
    converted = tmp_path / "fp32"
    subprocess.run(
        [sys.executable, str(script), str(checkpoints), str(converted)],
        check=True, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    state = torch.load(converted / "pytorch_model.bin", map_location="cpu", weights_only=True)
    model = small_gpt()
    model.load_state_dict(state, strict=True)  # the keys carry no ORTModule prefix; tied weights are restored
    assert model.lm_head.weight is model.wte.weight
    initial = small_gpt().state_dict()
    assert any(not torch.equal(state[name], initial[name]) for name in initial), "the weights are the initial ones"
    # These weights are the trained state after `half` steps: they give the loss both runs logged at step `half`.
    assert loss_at(model, half) == pytest.approx(resumed[half]["loss"], rel=1e-5, abs=1e-6)
    assert loss_at(model, half) == pytest.approx(reference[half]["loss"], rel=1e-5, abs=1e-6)


def test_native_run_with_gradient_checkpointing_follows_the_plain_curve(
    tmp_path: Path, straight: tuple[Path, list[dict[str, float]]]
) -> None:
    """Native DeepSpeed ZeRO-3 with every block under torch.utils.checkpoint (the benchmark's native-z3-ckpt): the
    recompute gathers the block's parameters again and computes the same numbers."""
    _, reference = straight
    rows = train(tmp_path, "--native", "--gradient-checkpointing", "--steps", str(STEPS))
    assert json.loads((tmp_path / "args.json").read_text())["gradient_checkpointing"]
    assert losses(rows) == pytest.approx(losses(reference), rel=1e-6, abs=1e-7)


@pytest.mark.extended
def test_sigterm_saves_the_step_every_rank_is_in_and_the_run_resumes_on_the_curve(
    tmp_path: Path, straight: tuple[Path, list[dict[str, float]]]
) -> None:
    """SIGTERM to torchrun during step 2 (scripts/preempted_train_gpt.py): both ranks save at its end, exit 0 within
    torchrun's 30 s grace period, and --resume continues the uninterrupted native curve in ORT."""
    _, reference = straight
    out = tmp_path / "ort"
    argv = ["--deepspeed_config", str(CONFIG), "--output-dir", str(out), *SMALL, "--steps", str(STEPS)]
    script = Path(__file__).parent / "scripts" / "preempted_train_gpt.py"
    preempted = run_launcher(torchrun_cmd(script, argv, port=free_port()), timeout=400, cwd=ROOT, check=False)
    signalled = json.loads((out / "signalled.json").read_text())
    assert (out / "checkpoints" / "latest").read_text() == f"global_step{signalled['step'] + 1}", preempted.stdout
    for rank in (0, 1):
        exited = json.loads((out / f"exit-rank{rank}.json").read_text())
        assert exited["code"] == 0 and exited["time"] - signalled["time"] < 30, exited
    assert f"saved step {signalled['step'] + 1} and stopped" in preempted.stdout
    assert_ran_in_ort(out)
    resumed = train(out, "--resume", "--steps", str(STEPS))
    assert losses(resumed) == pytest.approx(losses(reference), rel=1e-5, abs=1e-6)
    assert_ran_in_ort(out)


@pytest.mark.extended
def test_a_full_disk_stops_every_rank_before_the_save_and_the_run_resumes_once_there_is_room(
    tmp_path: Path, straight: tuple[Path, list[dict[str, float]]]
) -> None:
    """A tmpfs with room for the first checkpoint (1.4 MB; estimated before it at 2 MB) and not for a second beside it:
    both ranks stop before step 4's save with the error naming the folder; step 2's checkpoint resumes."""
    _, reference = straight
    with tmpfs(tmp_path / "disk", 2500) as disk:
        out = disk / "hooks"
        argv = ["--deepspeed_config", str(CONFIG), "--output-dir", str(out), *SMALL, "--steps", str(STEPS)]
        argv += ["--no-ort", "--save-every", "2"]
        full = run_launcher(torchrun_cmd(TRAINER, argv, port=free_port()), timeout=400, cwd=ROOT, check=False)
        assert full.returncode != 0
        for rank in (0, 1):
            message = f"train_gpt: error (rank {rank}): not enough space to save the checkpoint of step 4 in {out}"
            assert message in full.stdout, full.stdout[-3000:]
        assert (out / "checkpoints" / "latest").read_text() == "global_step2"
        assert not (out / "checkpoints" / "global_step4").exists()
        remount(disk, 64 * 1024)
        resumed = train(out, "--no-ort", "--resume", "--save-every", "2", "--steps", str(STEPS))
    assert losses(resumed) == pytest.approx(losses(reference), rel=1e-5, abs=1e-6)
