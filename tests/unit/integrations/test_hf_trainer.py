"""ORTZeroTrainer refuses what cannot run in ONNX Runtime under ZeRO-3 before anything starts: one line that says
why and the way out; activation checkpointing becomes ort_zero's layer-wise recompute; evaluation after training
runs DeepSpeed's engine. (Training itself: tests/distributed/test_train_hf.py.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Trainer, TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

from ort_zero import settings
from ort_zero.integrations.hf_trainer import (
    ORTZeroTrainer,
    UnsupportedInORT,
    check_arguments,
    recompute_instead_of_checkpointing,
)
from ort_zero.zero3 import activation_checkpointing


@pytest.fixture(autouse=True)
def no_deepspeed_config_left() -> Iterator[None]:
    """A DeepSpeed config made here must not make later tests build Hugging Face models under zero.Init."""
    yield
    unset_hf_deepspeed_config()


def zero3_arguments(tmp_path: Path, stage: int = 3, **options: Any) -> TrainingArguments:
    """TrainingArguments as with a DeepSpeed config, without starting a process group (which deepspeed=... does)."""
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], **options)
    config = {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": 1}
    args.deepspeed = f"zero{stage}.json"
    args.hf_deepspeed_config = HfTrainerDeepSpeedConfig(config)
    return args


def refusal(args: TrainingArguments | None, model: torch.nn.Module | None = None) -> str:
    with pytest.raises(UnsupportedInORT) as caught:
        check_arguments(args, model)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_zero3_arguments_pass(tmp_path: Path) -> None:
    check_arguments(zero3_arguments(tmp_path), torch.nn.Linear(2, 2))


def test_no_deepspeed_config(tmp_path: Path) -> None:
    for args in (None, TrainingArguments(output_dir=str(tmp_path), report_to=[])):
        assert "pass TrainingArguments(deepspeed=" in refusal(args)


def test_zero_stage_other_than_3(tmp_path: Path) -> None:
    message = refusal(zero3_arguments(tmp_path, stage=2))
    assert "needs ZeRO stage 3" in message and "asks for stage 2" in message and "transformers.Trainer" in message


@pytest.mark.parametrize("stage", [3, 2])
def test_accelerates_deepspeed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: int) -> None:
    """`accelerate launch --use_deepspeed --zero_stage N`: no `deepspeed` argument, accelerate's plugin from the
    environment; stage 3 passes, another stage is refused naming the plugin."""
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", str(stage))
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert args.deepspeed is None and args.deepspeed_plugin is not None
    if stage == 3:
        check_arguments(args, torch.nn.Linear(2, 2))
        return
    message = refusal(args)
    assert "accelerate's DeepSpeed plugin asks for stage 2" in message and "--zero_stage 3" in message


@pytest.fixture
def recompute(monkeypatch: pytest.MonkeyPatch) -> None:
    """No recompute level set, nothing announced yet in this process."""
    monkeypatch.setattr(settings, "recompute_level_override", None)
    monkeypatch.delenv("ORTMODULE_MEMORY_OPT_LEVEL", raising=False)
    monkeypatch.setattr(activation_checkpointing, "_announced", False)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("name", ["activation_checkpointing", "gradient_checkpointing"])
def test_activation_checkpointing_becomes_ort_zeros_layer_wise_recompute(
    tmp_path: Path, recompute: None, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """Under either name (`gradient_checkpointing` is transformers 5's deprecated alias): the Trainer gets arguments
    that leave Hugging Face's checkpoint calls off under both names; level 1 is set and announced; the caller's
    arguments are unchanged."""
    args = zero3_arguments(tmp_path, **{name: True})
    check_arguments(args, torch.nn.Linear(2, 2))
    with caplog.at_level(logging.WARNING, logger=activation_checkpointing.__name__):
        given = recompute_instead_of_checkpointing(args, torch.nn.Linear(2, 2))
    assert not given.activation_checkpointing and not given.gradient_checkpointing
    assert args.activation_checkpointing and args.gradient_checkpointing
    assert given.output_dir == args.output_dir and given.hf_deepspeed_config is args.hf_deepspeed_config
    assert settings.recompute_level() == 1
    (announcement,) = [r.getMessage() for r in caplog.records]
    assert "layer-wise recompute (ORTMODULE_MEMORY_OPT_LEVEL=1)" in announcement


def test_checkpointing_enabled_on_the_model_keeps_a_higher_level(
    tmp_path: Path, recompute: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "2")
    model = torch.nn.Linear(2, 2)
    model.is_activation_checkpointing = True  # what PreTrainedModel.activation_checkpointing_enable() leaves
    args = zero3_arguments(tmp_path)
    assert recompute_instead_of_checkpointing(args, model) is args  # the export runs its checkpoints as plain calls
    assert settings.recompute_level_override == 2


def test_without_checkpointing_nothing_changes(tmp_path: Path, recompute: None) -> None:
    args = zero3_arguments(tmp_path)
    assert recompute_instead_of_checkpointing(args, torch.nn.Linear(2, 2)) is args
    assert settings.recompute_level_override is None and not activation_checkpointing._announced


def test_torch_compile(tmp_path: Path) -> None:
    assert "set torch_compile=False" in refusal(zero3_arguments(tmp_path, torch_compile=True))


def test_label_smoothing(tmp_path: Path) -> None:
    message = refusal(zero3_arguments(tmp_path, label_smoothing_factor=0.1))
    assert "would not shift the labels" in message and "label_smoothing_factor=0" in message


def test_model_already_in_ortmodule(tmp_path: Path) -> None:
    from onnxruntime.training.ortmodule import ORTModule

    message = refusal(zero3_arguments(tmp_path), ORTModule(torch.nn.Linear(2, 2)))
    assert "already an ORTModule; pass the plain model" in message


def test_the_trainer_refuses_when_created(tmp_path: Path) -> None:
    """Before the Trainer builds anything (no accelerator, no DeepSpeed)."""
    with pytest.raises(UnsupportedInORT, match="torch_compile"):
        ORTZeroTrainer(model=torch.nn.Linear(2, 2), args=zero3_arguments(tmp_path, torch_compile=True))


def test_accelerate_counting_fewer_processes_than_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed on CPU without use_cpu=True: accelerate sees one process of the two ranks."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    message = refusal(zero3_arguments(tmp_path))
    assert "sees 1 process(es) of the 2 ranks" in message and "TrainingArguments(use_cpu=True)" in message


def test_evaluation_after_training_runs_deepspeeds_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the engine exists the Trainer evaluates `trainer.model` (PyTorch): the engine (ORT) runs instead, in the
    mode the Trainer set on the model. Before training (no engine yet) and for any other model nothing changes."""
    seen: list[tuple[torch.nn.Module, bool]] = []

    def prediction_step(self: Trainer, model: torch.nn.Module, *rest: Any) -> tuple[None, None, None]:
        seen.append((model, model.training))
        return None, None, None

    monkeypatch.setattr(Trainer, "prediction_step", prediction_step)
    trainer = ORTZeroTrainer.__new__(ORTZeroTrainer)  # prediction_step alone: no accelerator, no DeepSpeed
    trainer.model = trainer.model_wrapped = torch.nn.Linear(2, 2).eval()
    trainer.prediction_step(trainer.model, {}, True)
    engine = torch.nn.Sequential(trainer.model).train()  # stands for DeepSpeed's engine around the ORTModule
    trainer.model_wrapped = engine
    trainer.model.eval()  # what the Trainer's evaluation loop does before its steps
    trainer.prediction_step(trainer.model, {}, True)
    other = torch.nn.Linear(2, 2)
    trainer.prediction_step(other, {}, True)
    assert seen == [(trainer.model, False), (engine, False), (other, True)]


def test_a_model_type_that_does_not_train_in_ort_is_refused_in_one_line(tmp_path: Path) -> None:
    """The check reads the model's config (a model is not built here: under the arguments' ZeRO-3 config transformers
    would build it under zero.Init)."""
    from transformers import AutoConfig

    model = torch.nn.Linear(2, 2)
    model.config = AutoConfig.for_model("afmoe")
    message = refusal(zero3_arguments(tmp_path), model)
    assert "model type 'afmoe' does not train in ONNX Runtime on this stack" in message
    assert "breaks the ties" in message and "transformers.Trainer" in message


def test_every_refused_type_is_one_transformers_builds() -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from ort_zero.integrations.model_types import UNSUPPORTED

    assert set(UNSUPPORTED) <= set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
