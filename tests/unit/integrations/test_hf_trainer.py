"""ORTZeroTrainer refuses what cannot run in ONNX Runtime under ZeRO-3 before anything starts: one line that says
why and the way out. (Training itself: tests/distributed/test_train_hf.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

from ort_zero.integrations.hf_trainer import ORTZeroTrainer, UnsupportedInORT, check_arguments


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


def test_gradient_checkpointing_in_arguments_or_on_the_model(tmp_path: Path) -> None:
    message = refusal(zero3_arguments(tmp_path, gradient_checkpointing=True))
    assert "gradient checkpointing cannot run in ONNX Runtime" in message and "gradient_checkpointing=False" in message
    model = torch.nn.Linear(2, 2)
    model.is_gradient_checkpointing = True  # what PreTrainedModel.gradient_checkpointing_enable() leaves
    assert "gradient checkpointing" in refusal(zero3_arguments(tmp_path), model)


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
    with pytest.raises(UnsupportedInORT, match="gradient checkpointing"):
        ORTZeroTrainer(model=torch.nn.Linear(2, 2), args=zero3_arguments(tmp_path, gradient_checkpointing=True))


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
