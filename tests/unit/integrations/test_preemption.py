"""The Trainer's agreed save-and-stop on SIGTERM (integrations/preemption.py) in place of transformers' JIT checkpoint
callback; the signals between real ranks: tests/distributed/test_preemption.py."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_jit_checkpoint import JITCheckpointCallback

from ort_zero.integrations.checkpoints import SpaceBeforeSave
from ort_zero.integrations.preemption import AgreedStopOnSigterm, stop_on_sigterm, stopped_at


@pytest.fixture(autouse=True)
def sigterm_handler_restored() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def jit_trainer(tmp_path: Path) -> Trainer:
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, enable_jit_checkpoint=True)
    return Trainer(model=torch.nn.Linear(2, 2), args=args)


def callbacks(trainer: Trainer) -> list[type]:
    return [type(callback) for callback in trainer.callback_handler.callbacks]


def test_transformers_jit_callback_is_replaced_and_its_handler_given_back(tmp_path: Path) -> None:
    def before(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, before)
    trainer = jit_trainer(tmp_path)
    assert JITCheckpointCallback in callbacks(trainer) and signal.getsignal(signal.SIGTERM) is not before
    stop = stop_on_sigterm(trainer)
    assert stop_on_sigterm(trainer) is stop, "not idempotent"
    assert JITCheckpointCallback not in callbacks(trainer) and signal.getsignal(signal.SIGTERM) is before
    assert callbacks(trainer).count(AgreedStopOnSigterm) == 1
    assert callbacks(trainer)[-1] is SpaceBeforeSave, "the room for the SIGTERM save would not be checked"
    assert stopped_at(trainer) is None


def test_a_noted_sigterm_saves_and_stops_at_the_step_end(tmp_path: Path) -> None:
    trainer = jit_trainer(tmp_path)
    stop = stop_on_sigterm(trainer)
    state, control = TrainerState(global_step=7), TrainerControl()
    stop.on_train_begin(trainer.args, state, control)
    stop.on_step_end(trainer.args, state, control)
    assert not (control.should_save or control.should_training_stop)
    signal.raise_signal(signal.SIGTERM)  # noted, not fatal
    stop.on_step_end(trainer.args, state, control)
    assert control.should_save and control.should_training_stop and stopped_at(trainer) == 7
