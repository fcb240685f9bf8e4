"""A rank killed mid-run under `torchrun --max-restarts 1` (scripts/die_then_restart.py: rank 1 `os._exit`s at step
5 of the first attempt; in the restarted attempt rank 0 starts its group 4 s after rank 1): the restarted attempt
forms its process group on a store without the dead attempt's addresses (ort_zero/restarts.py), resumes by itself
from the newest checkpoint (`--resume auto`) and ends with the uninterrupted run's losses and weights, with
torchrun's static and c10d rendezvous, natively and in ORT, whether ort_zero, DeepSpeed, torch or accelerate started
the group. Without it, the restarted ranks read the dead attempt's gloo addresses from torchrun's store:
"connectFullMesh failed ... Connection refused", or both ranks waiting to be connected until the group's timeout. A
restarted rank whose peer never starts its group fails after ORT_ZERO_COLLECTIVE_TIMEOUT with one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from launcher import Launch, final_weights, free_port, logged_losses, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
TRAIN_GPT = ROOT / "ort_zero" / "examples" / "train_gpt.py"
TRAIN_HF = ROOT / "ort_zero" / "examples" / "train_hf.py"
HF_JOB = ["--deepspeed", str(ROOT / "ds_configs" / "zero3_hf_auto.json"), "--max-steps", "8", "--save-steps", "3"]
DIE_THEN_RESTART = Path(__file__).parent / "scripts" / "die_then_restart.py"
CONFIG = ROOT / "ds_configs" / "zero3_cpu_fp32.json"
JOB = [
    "--deepspeed_config", str(CONFIG), "--seq-len", "32", "--d-model", "64", "--n-layer", "2", "--n-head", "4",
    "--seed", "7", "--steps", "8", "--save-every", "3",
]  # fmt: skip
MODES = {"native": ["--native"], "ort": ["--ort"], "hooks": ["--no-ort"]}
HF_MODES = {"native": ["--no-ort"], "ort": []}
TOLERANCE = 1e-5
TIMEOUT = 500
BRIDGES = {"ort_zero.zero3.bridges.PreForwardBridge", "ort_zero.zero3.bridges.PostForwardBridge"}


def launch(
    script: Path,
    out: Path,
    mode: str,
    rendezvous: str = "static",
    env: dict[str, str] | None = None,
    job: tuple[str, ...] = (*JOB, "--resume", "auto"),
    modes: dict[str, list[str]] = MODES,
) -> subprocess.CompletedProcess:
    port = free_port()
    options = ("--max-restarts", "1")
    if rendezvous == "c10d":
        options += ("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}")
    argv = torchrun_cmd(script, [*job, *modes[mode], "--output-dir", str(out)], port=port, options=options)
    return run_launcher(argv, timeout=TIMEOUT, cwd=ROOT, env=env, check=False)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One run per mode without a fault, made lazily."""
    runs: dict[str, Path] = {}

    class Runs(dict):
        def __missing__(self, mode: str) -> Path:
            out = tmp_path_factory.mktemp(f"uninterrupted_{mode}")
            done = launch(TRAIN_GPT, out, mode)
            assert done.returncode == 0, done.stdout[-4000:]
            self[mode] = out
            return out

    return Runs(runs)


def check_restarted_run(out: Path, done: subprocess.CompletedProcess, reference: Path) -> None:
    assert done.returncode == 0, done.stdout[-6000:]
    assert "die_then_restart: rank 1 exits with 17 at step 5" in done.stdout
    assert "die_then_restart: attempt 1 rank 0 starts its group" in done.stdout, "torchrun did not restart the job"
    assert "connectFullMesh" not in done.stdout
    assert (out / "checkpoints" / "global_step3").is_dir() and (out / "checkpoints" / "global_step6").is_dir()
    assert len(logged_losses(out)) == 8
    assert logged_losses(out) == pytest.approx(logged_losses(reference), abs=TOLERANCE)
    resumed, straight = final_weights(out), final_weights(reference)
    assert set(resumed) == set(straight)
    assert max((resumed[name] - straight[name]).abs().max().item() for name in resumed) <= TOLERANCE


@pytest.mark.extended  # the default set restarts a killed rank in test_a_group_the_script_started_restarts_and_resumes
@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_a_killed_rank_restarts_and_resumes_natively(
    tmp_path: Path, uninterrupted: dict[str, Path], rendezvous: str
) -> None:
    done = launch(DIE_THEN_RESTART, tmp_path, "native", rendezvous)
    check_restarted_run(tmp_path, done, uninterrupted["native"])


@pytest.mark.extended
@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_a_killed_rank_restarts_and_resumes_in_ort(
    tmp_path: Path, uninterrupted: dict[str, Path], rendezvous: str
) -> None:
    done = launch(DIE_THEN_RESTART, tmp_path, "ort", rendezvous)
    check_restarted_run(tmp_path, done, uninterrupted["ort"])
    training = json.loads((tmp_path / "ort.json").read_text())["training"]
    assert training["session"] and BRIDGES <= set(training["python_ops"]), training


@pytest.mark.parametrize(
    "group",
    [
        "deepspeed",
        pytest.param("torch", marks=pytest.mark.extended),
        pytest.param("accelerate", marks=pytest.mark.extended),
    ],
)
def test_a_group_the_script_started_restarts_and_resumes(
    tmp_path: Path, uninterrupted: dict[str, Path], group: str
) -> None:
    """The group started by DeepSpeed's `init_distributed()`, torch's `env://` or accelerate, not by ort_zero:
    ort_zero's ZeRO-3 setup takes the addresses out of torchrun's store (ort_zero/restarts.py)."""
    done = launch(DIE_THEN_RESTART, tmp_path, "hooks", env={"DIE_THEN_RESTART_GROUP": group})
    check_restarted_run(tmp_path, done, uninterrupted["hooks"])


@pytest.mark.extended
def test_a_restarted_rank_whose_peer_never_starts_fails_in_one_line(tmp_path: Path) -> None:
    env = {"DIE_THEN_RESTART_NEVER_START": "1", "ORT_ZERO_COLLECTIVE_TIMEOUT": "10"}
    done = launch(DIE_THEN_RESTART, tmp_path, "native", env=env)
    assert done.returncode != 0
    assert "die_then_restart: attempt 1 rank 1 starts its group" in done.stdout, done.stdout[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("train_gpt: error (rank 1)")]
    assert len(lines) == 1 and "could not start the process group with the other ranks" in lines[0], lines
    restarted = done.stdout.split("attempt 1 rank 1 starts its group")[1]
    assert "Traceback" not in restarted.split("torch/distributed/elastic")[0], "the rank showed a traceback"


@pytest.mark.extended
@pytest.mark.parametrize("group", ["ort_zero", "deepspeed"])
def test_an_ort_zero_trainer_job_restarts_and_resumes(tmp_path: Path, group: str) -> None:
    """train_hf (ORTZeroTrainer, checkpoint-N every 3 steps) under the same fault: the restarted attempt resumes
    from checkpoint-3 (`--resume auto`: the newest complete checkpoint) onto transformers.Trainer's curve; also when
    the script starts the group with DeepSpeed's `init_distributed()` before creating the Trainer (issue 56)."""
    env, job = {"DIE_THEN_RESTART_EXAMPLE": "train_hf", "DIE_THEN_RESTART_GROUP": group}, (*HF_JOB, "--resume", "auto")
    done = launch(DIE_THEN_RESTART, tmp_path / "ort", "ort", env=env, job=job, modes=HF_MODES)
    assert done.returncode == 0, done.stdout[-6000:]
    assert "die_then_restart: rank 1 exits with 17 at step 5" in done.stdout
    assert "die_then_restart: attempt 1 rank 0 starts its group" in done.stdout
    reference = launch(TRAIN_HF, tmp_path / "native", "native", job=HF_JOB, modes=HF_MODES)
    assert reference.returncode == 0, reference.stdout[-4000:]
    assert len(logged_losses(tmp_path / "ort")) == 8
    assert logged_losses(tmp_path / "ort") == pytest.approx(logged_losses(tmp_path / "native"), abs=TOLERANCE)
    assert json.loads((tmp_path / "ort" / "ort.json").read_text())["training"]["session"]


@pytest.mark.extended
def test_two_nodes_restart_and_resume_from_the_same_checkpoint(tmp_path: Path, uninterrupted: dict[str, Path]) -> None:
    """Two torchrun agents (one rank each, c10d rendezvous) as two nodes; rank 1 dies once. Each agent counts its
    restarts on its own; both ranks of the new round resume at the same step onto the uninterrupted run's losses."""
    port, out = free_port(), tmp_path / "run"
    options = ("--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}")
    env = {"DIE_THEN_RESTART_ONCE": str(tmp_path / "died")}
    args = [*JOB, "--resume", "auto", *MODES["hooks"], "--output-dir", str(out)]
    nodes = [
        torchrun_cmd(DIE_THEN_RESTART, args, port=port, nproc=1, nnodes=2, node_rank=n, options=options) for n in (0, 1)
    ]
    with Launch(nodes[0], env=env, cwd=ROOT) as first, Launch(nodes[1], env=env, cwd=ROOT) as second:
        done = [first.finish(timeout=TIMEOUT, check=False), second.finish(timeout=TIMEOUT, check=False)]
    output = done[0].stdout + done[1].stdout
    assert [node.returncode for node in done] == [0, 0], output[-6000:]
    assert "die_then_restart: rank 1 exits with 17 at step 5" in output
    resumed = sorted(line.split(" rank ")[1] for line in output.splitlines() if "resumes at step 3" in line)
    assert resumed == ["0 resumes at step 3", "1 resumes at step 3"], output[-6000:]
    assert logged_losses(out) == pytest.approx(logged_losses(uninterrupted["hooks"]), abs=TOLERANCE)


@pytest.mark.extended
def test_a_damaged_newest_checkpoint_is_skipped_by_resume_auto(tmp_path: Path, uninterrupted: dict[str, Path]) -> None:
    """train_gpt's `--resume auto` with rank 1's optimizer states of the newest tag cut to half: one line naming the
    file, then the run resumes from the tag before and ends on the uninterrupted losses."""
    out = tmp_path / "run"
    shutil.copytree(uninterrupted["hooks"], out)
    damaged = out / "checkpoints" / "global_step8" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    done = launch(TRAIN_GPT, out, "hooks")
    assert done.returncode == 0, done.stdout[-6000:]
    said = [line for line in done.stdout.splitlines() if "global_step8 damaged (" in line]
    assert len(said) == 1 and said[0].startswith(f"train_gpt: {out / 'checkpoints' / 'global_step8'} damaged"), said
    assert f"({damaged.name} (truncated" in said[0] and said[0].endswith("; resuming from global_step6")
    assert logged_losses(out) == pytest.approx(logged_losses(uninterrupted["hooks"]), abs=TOLERANCE)
