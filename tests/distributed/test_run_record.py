"""`ort-zero compare` on run records of real 2-rank runs (the small GPT, train_gpt --record): runs that should train
alike agree (ZeRO-2 and ZeRO-3; 2 ranks and 1 rank with accumulation 2; PyTorch and ORT; fp32 and bf16 within
bf16's tolerance), and planted faults are found at the step and place planted, not later."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launcher import free_port, run_launcher, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "ort_zero" / "examples" / "train_gpt.py"
HF_TRAINER = ROOT / "ort_zero" / "examples" / "train_hf.py"
PLANTED = Path(__file__).resolve().parent / "scripts" / "planted_faults.py"
COMPILED = Path(__file__).resolve().parent / "scripts" / "compiled_train_gpt.py"
CONFIG = ROOT / "ds_configs" / "zero3_cpu_fp32.json"
SMALL = ["--seq-len", "32", "--d-model", "64", "--n-layer", "2", "--n-head", "4", "--seed", "7", "--steps", "6"]
PLANT_STEP = 3
ACCELERATE_PLUGIN = ["--use_deepspeed", "--zero_stage", "3", "--num_processes", "2", "--num_machines", "1"]

pytestmark = pytest.mark.extended


def config(tmp: Path, name: str, **changes: object) -> Path:
    """zero3_cpu_fp32.json with top-level `changes`; `stage` sets ZeRO's stage."""
    settings = json.loads(CONFIG.read_text())
    if "stage" in changes:
        settings["zero_optimization"]["stage"] = changes.pop("stage")
    settings.update(changes)
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(settings))
    return path


def record(
    tmp: Path, name: str, *mode: str, ds_config: Path = CONFIG, nproc: int = 2, plant: str = "", script: Path = TRAINER
) -> Path:
    """Train the small GPT with --record; the record's folder."""
    script = PLANTED if plant else script
    argv = ["--deepspeed_config", str(ds_config), "--output-dir", str(tmp / name), "--record", str(tmp / f"{name}_rec")]
    env = {"PLANT": plant} if plant else None
    run_launcher(torchrun_cmd(script, [*argv, *SMALL, *mode], port=free_port(), nproc=nproc), timeout=400, env=env)
    return tmp / f"{name}_rec"


def compare(a: Path, b: Path, *options: str, expect_one_line: bool = True) -> tuple[int, str]:
    command = [str(Path(sys.executable).parent / "ort-zero"), "compare", str(a), str(b), *options]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if expect_one_line:  # the verdict, and nothing else on the console
        assert result.stdout.startswith("[compare]") and not result.stderr, result.stdout + result.stderr
    return result.returncode, result.stdout + result.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("records")


@pytest.fixture(scope="module")
def zero3(runs: Path) -> Path:
    return record(runs, "zero3", "--native")


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_other_zero_stages_and_zero3_agree(runs: Path, zero3: Path, stage: int) -> None:
    other = record(runs, f"zero{stage}", "--native", ds_config=config(runs, f"zero{stage}", stage=stage))
    code, said = compare(other, zero3, "--output", str(runs / f"zero{stage}_zero3.md"))
    assert code == 0 and "[compare] AGREE over 6 steps" in said, said
    assert (runs / f"zero{stage}_zero3.png").read_bytes()[:4] == b"\x89PNG"
    assert f"ZeRO-{stage}" in (runs / f"zero{stage}_zero3.md").read_text()


def test_two_ranks_and_one_rank_with_accumulation_agree(runs: Path, zero3: Path) -> None:
    accumulating = config(runs, "accumulating", gradient_accumulation_steps=2)
    one = record(runs, "one_rank", "--native", ds_config=accumulating, nproc=1)
    code, said = compare(zero3, one)
    assert code == 0, said


def module_outputs(recorded: Path) -> list[set[str]]:
    return [set(json.loads(line)["activations"] or ()) for line in (recorded / "steps.jsonl").read_text().splitlines()]


def test_pytorch_and_ort_agree_module_by_module(runs: Path, zero3: Path) -> None:
    """ORT runs its graph, not the modules: their outputs reach the record through recorder ops in that graph."""
    ort = record(runs, "ort", "--ort")
    assert json.loads((ort / "record.json").read_text())["backend"] == "ort"
    assert module_outputs(ort) == module_outputs(zero3) and len(module_outputs(ort)[0]) > 20
    code, said = compare(zero3, ort, "--output", str(runs / "ort.md"))
    assert code == 0, said
    assert "the forward: module by module" in (runs / "ort.md").read_text()


def test_a_compiled_engine_and_an_eager_one_agree(runs: Path, zero3: Path) -> None:
    """`engine.compile()` (inductor on CPU): the module outputs are still recorded and compared module by module."""
    compiled = record(runs, "compiled", "--native", script=COMPILED)
    code, said = compare(zero3, compiled, "--output", str(runs / "compiled.md"))
    assert code == 0 and "AGREE over 6 steps" in said, said
    assert "the forward: module by module" in (runs / "compiled.md").read_text()


def test_fp32_and_bf16_part_only_within_bf16s_tolerance(runs: Path, zero3: Path) -> None:
    bf16 = record(runs, "bf16", "--native", ds_config=config(runs, "bf16", bf16={"enabled": True}))
    code, said = compare(zero3, bf16)
    assert code == 0 and "within 0.05" in said, said
    code, said = compare(zero3, bf16, "--rtol", "1e-4")
    assert code == 1, said


def test_a_gradient_scaled_in_one_layer_is_found_at_its_step_and_layer(runs: Path, zero3: Path) -> None:
    planted = record(runs, "grad", "--native", plant=f"grad:1:{PLANT_STEP}:1.5")
    code, said = compare(zero3, planted)
    assert code == 1 and f"PART at step {PLANT_STEP}, in the backward" in said and "(layer blocks.1)" in said, said


def test_an_activation_perturbed_in_one_layer_is_found_in_that_steps_forward(runs: Path, zero3: Path) -> None:
    planted = record(runs, "act", "--native", plant=f"act:1:{PLANT_STEP}:1.01")
    code, said = compare(zero3, planted)
    assert code == 1 and f"PART at step {PLANT_STEP}, in the forward: blocks.1/output_0 (layer blocks.1)" in said, said


def test_an_activation_perturbed_in_one_layer_of_an_ort_run_is_found_in_that_steps_forward(
    runs: Path, zero3: Path
) -> None:
    planted = record(runs, "act_ort", "--ort", plant=f"act:1:{PLANT_STEP}:1.01")
    code, said = compare(zero3, planted)
    assert code == 1 and f"PART at step {PLANT_STEP}, in the forward: blocks.1/output_0 (layer blocks.1)" in said, said


def test_an_update_lost_on_one_rank_is_found_in_that_steps_optimizer_step(runs: Path, zero3: Path) -> None:
    planted = record(runs, "update", "--native", plant=f"update:1:{PLANT_STEP}")
    code, said = compare(zero3, planted)
    assert code == 1 and f"PART at step {PLANT_STEP}, in the optimizer step" in said, said


def test_runs_on_other_data_are_refused(runs: Path, zero3: Path) -> None:
    other = record(runs, "other_seed", "--native", "--seed", "8")  # later on the command line: replaces SMALL's 7
    code, said = compare(zero3, other, expect_one_line=False)
    assert code == 2 and "the runs trained on other data: step 0's samples differ (0 of 8 in both" in said, said


def test_a_trainer_and_an_ort_zero_trainer_agree(runs: Path) -> None:
    """transformers.Trainer and ORTZeroTrainer, each recorded by `record_trainer` (train_hf --record)."""
    recorded = []
    for name, mode in (("trainer", ["--no-ort"]), ("ort_zero_trainer", [])):
        argv = ["--deepspeed", str(ROOT / "ds_configs" / "zero3_hf_auto.json"), "--max-steps", "4"]
        argv += ["--model-type", "llama", "--output-dir", str(runs / name), "--record", str(runs / f"{name}_rec")]
        run_launcher(torchrun_cmd(HF_TRAINER, [*argv, *mode], port=free_port(), nproc=2), timeout=400)
        recorded.append(runs / f"{name}_rec")
    assert [json.loads((r / "record.json").read_text())["backend"] for r in recorded] == ["pytorch", "ort"]
    code, said = compare(*recorded)
    assert code == 0 and "AGREE over 4 steps" in said, said


def test_trl_and_accelerate_runs_in_pytorch_and_ort_agree(runs: Path) -> None:
    """TRL's SFTTrainer (`record_trainer`) and a plain accelerate loop (`record_engine` on the engine accelerate
    made), each natively and in ORT."""
    scripts = Path(__file__).resolve().parent / "scripts"
    for job in ("trl", "accelerate"):
        recorded = []
        for mode in ("native", "ort"):
            out, rec = runs / f"{job}_{mode}", runs / f"{job}_{mode}_rec"
            options = ["--out", str(out), "--steps", "4", "--record", str(rec)] + (["--ort"] if mode == "ort" else [])
            if job == "trl":
                argv = torchrun_cmd(scripts / "train_trl.py", ["--trainer", "sft", *options], port=free_port())
            else:
                launch = [str(Path(sys.executable).parent / "accelerate"), "launch", *ACCELERATE_PLUGIN]
                argv = [*launch, "--main_process_port", str(free_port()), str(scripts / "accelerate_loop.py"), *options]
            run_launcher(argv, timeout=400, cwd=ROOT)
            recorded.append(rec)
        code, said = compare(*recorded)
        assert code == 0 and "AGREE over 4 steps" in said, (job, said)
