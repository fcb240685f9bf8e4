"""ORTZeroTrainer refuses what cannot run in ONNX Runtime under ZeRO-3 before anything starts: one line that says
why and the way out; gradient checkpointing becomes ort_zero's layer-wise recompute. (Training itself:
tests/distributed/test_train_hf.py.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

from ort_zero import settings
from ort_zero.integrations.hf_trainer import (
    ORTZeroTrainer,
    UnsupportedInORT,
    check_arguments,
    recompute_instead_of_checkpointing,
)
from ort_zero.zero3 import checkpointing


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


@pytest.fixture
def recompute(monkeypatch: pytest.MonkeyPatch) -> None:
    """No recompute level set, nothing announced yet in this process."""
    monkeypatch.setattr(settings, "recompute_level_override", None)
    monkeypatch.delenv("ORTMODULE_MEMORY_OPT_LEVEL", raising=False)
    monkeypatch.setattr(checkpointing, "_announced", False)


def test_gradient_checkpointing_becomes_ort_zeros_layer_wise_recompute(
    tmp_path: Path, recompute: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The Trainer gets arguments that leave Hugging Face's checkpoint calls off; level 1 is set and announced;
    the caller's arguments are unchanged."""
    args = zero3_arguments(tmp_path, gradient_checkpointing=True)
    check_arguments(args, torch.nn.Linear(2, 2))
    with caplog.at_level(logging.WARNING, logger=checkpointing.__name__):
        given = recompute_instead_of_checkpointing(args, torch.nn.Linear(2, 2))
    assert not given.gradient_checkpointing and args.gradient_checkpointing
    assert given.output_dir == args.output_dir and given.hf_deepspeed_config is args.hf_deepspeed_config
    assert settings.recompute_level() == 1
    (announcement,) = [r.getMessage() for r in caplog.records]
    assert "layer-wise recompute (ORTMODULE_MEMORY_OPT_LEVEL=1)" in announcement


def test_checkpointing_enabled_on_the_model_keeps_a_higher_level(
    tmp_path: Path, recompute: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "2")
    model = torch.nn.Linear(2, 2)
    model.is_gradient_checkpointing = True  # what PreTrainedModel.gradient_checkpointing_enable() leaves
    args = zero3_arguments(tmp_path)
    assert recompute_instead_of_checkpointing(args, model) is args  # the export runs its checkpoints as plain calls
    assert settings.recompute_level_override == 2


def test_without_checkpointing_nothing_changes(tmp_path: Path, recompute: None) -> None:
    args = zero3_arguments(tmp_path)
    assert recompute_instead_of_checkpointing(args, torch.nn.Linear(2, 2)) is args
    assert settings.recompute_level_override is None and not checkpointing._announced


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


def test_a_token_count_given_as_a_number_reaches_the_model_as_a_tensor(tmp_path: Path) -> None:
    """With average_tokens_across_devices the Trainer passes num_items_in_batch as a Python number, which ORT would
    freeze into the exported graph; ORTZeroTrainer hands it over as a tensor."""

    class LossKwargs(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, **loss_kwargs: Any) -> dict[str, Any]:
            self.seen = loss_kwargs["num_items_in_batch"]
            return {"loss": input_ids.float().sum() / self.seen}

    trainer = ORTZeroTrainer.__new__(ORTZeroTrainer)  # compute_loss alone: no accelerator, no DeepSpeed
    trainer.args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    trainer.label_smoother, trainer.compute_loss_func, trainer.model_accepts_loss_kwargs = None, None, True
    model = LossKwargs()
    loss = trainer.compute_loss(model, {"input_ids": torch.ones(2, 3)}, num_items_in_batch=4)
    assert isinstance(model.seen, torch.Tensor) and model.seen.item() == 4 and loss.item() == 1.5
