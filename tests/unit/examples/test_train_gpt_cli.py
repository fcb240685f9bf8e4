"""train_gpt rejects bad input with one message and exit code 2, before the process group or DeepSpeed start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ort_zero.examples import train_gpt

CONFIGS = Path(__file__).resolve().parents[3] / "ds_configs"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert train_gpt.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("train_gpt: error: ") and "Traceback" not in err
    return err


def test_missing_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = run(capsys, "--deepspeed_config", str(tmp_path / "missing.json"))
    assert "not found" in err and "missing.json" in err


def test_malformed_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"zero_optimization": {"stage": 3}')
    err = run(capsys, "--deepspeed_config", str(path))
    assert "bad.json is not valid JSON" in err and "line 1" in err


def test_zero2_needs_native(capsys: pytest.CaptureFixture[str]) -> None:
    err = run(capsys, "--deepspeed_config", str(CONFIGS / "zero2_cpu_fp32.json"), "--no-ort")
    assert "needs ZeRO stage 3" in err


def test_config_without_optimizer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "noopt.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}))
    assert 'no "optimizer" block' in run(capsys, "--deepspeed_config", str(path))


def test_native_with_ort_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = run(capsys, "--deepspeed_config", str(CONFIGS / "zero3_cpu_fp32.json"), "--native", "--ort")
    assert "cannot be combined with --ort" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps must be positive"),
        (["--d-model", "30", "--n-head", "4"], "multiple of --n-head"),
        (["--dropout", "1.5"], "--dropout must be in [0, 1)"),
        (["--save-every", "-1"], "--save-every must be 0 or positive"),
    ],
)
def test_bad_arguments(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert message in run(capsys, "--deepspeed_config", str(CONFIGS / "zero3_cpu_fp32.json"), *argv)


def test_mode_defaults() -> None:
    config = str(CONFIGS / "zero3_cpu_fp32.json")
    assert train_gpt.parse_args(["--deepspeed_config", config]).ort is True
    assert train_gpt.parse_args(["--deepspeed_config", config, "--native"]).ort is False
    assert train_gpt.parse_args(["--deepspeed_config", config, "--no-ort"]).ort is False


@pytest.mark.parametrize("flag", [[], ["--gradient-checkpointing"]])
def test_gradient_checkpointing_reaches_the_model(flag: list[str]) -> None:
    args = train_gpt.parse_args(["--deepspeed_config", str(CONFIGS / "zero3_cpu_fp32.json"), "--native", *flag])
    assert train_gpt.build_model(args).config.gradient_checkpointing is bool(flag)


def test_a_bad_memory_opt_level_is_refused_for_ort_runs_only(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "7")
    config = str(CONFIGS / "zero3_cpu_fp32.json")
    assert "ORTMODULE_MEMORY_OPT_LEVEL='7'" in run(capsys, "--deepspeed_config", config, "--ort")
    train_gpt.check_args(train_gpt.parse_args(["--deepspeed_config", config, "--no-ort"]))  # no ORT graph: ignored
