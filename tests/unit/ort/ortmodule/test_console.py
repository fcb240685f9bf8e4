"""What ORTModule prints under ort_zero (`ort_zero.ort.ortmodule.console`): its records ort_zero makes obsolete are
dropped or demoted, everything else passes; importing ORT after ort_zero prints nothing on a machine without CUDA."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest
import torch

from ort_zero.ort.inspection import ort_run_record
from ort_zero.ort.ortmodule import console


def record(message: str, name: str = "orttraining.rank-0") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, None)


def test_the_deep_copy_warning_goes_and_other_warnings_stay() -> None:
    records = console.OrtRecords()
    assert not records.filter(record(f"{console.NOT_DEEP_COPIED}, the initial weights may not be preserved"))
    assert records.filter(record("Due to the limited GPU memory execution manager does not create a deep copy"))
    assert records.filter(record("Fallback to PyTorch due to exception ..."))


@pytest.mark.parametrize(
    "message",
    [
        "[export] Filtered logs (95 records suppressed):\n    a line torch printed",
        "Fast path enabled - skipping checks. rebuild gradient graph: True, execution agent recreation: True",
    ],
)
def test_ort_notes_are_debug(message: str) -> None:
    captured = record(message, "ort_zero.test")
    logging.getLogger("ort_zero.test").setLevel(logging.WARNING)
    assert not console.OrtRecords().filter(captured)
    assert captured.levelno == logging.DEBUG
    logging.getLogger("ort_zero.test").setLevel(logging.DEBUG)
    assert console.OrtRecords().filter(record("[export] Filtered logs (1 records suppressed):", "ort_zero.test"))


def test_importing_ort_after_ort_zero_prints_nothing() -> None:
    code = "import ort_zero; import onnxruntime.training.ortmodule; import torch.utils.cpp_extension"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    printed = [line for line in (child.stdout + child.stderr).splitlines() if "Setting accelerator to CPU" not in line]
    assert printed == []


class OwnTo(torch.nn.Module):
    """A model whose author defined `to` itself: ORTModule's `to` runs instead, which ORT rightly warns of."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).sum()

    def to(self, *args: object, **kwargs: object) -> OwnTo:
        return super().to(*args, **kwargs)


@pytest.fixture
def ort_warnings() -> Iterator[list[str]]:
    """What ORT's logger (a process without a process group: "orttraining") passes on, as it passes it on."""
    captured: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: captured.append(record.getMessage())  # type: ignore[method-assign]
    ort_logger = logging.getLogger("orttraining")
    ort_logger.addHandler(handler)
    yield captured
    ort_logger.removeHandler(handler)


def test_wrapping_a_hugging_face_model_says_nothing(enabled: None, ort_warnings: list[str]) -> None:
    from onnxruntime.training.ortmodule import ORTModule
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    with warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        model = ORTModule(LlamaForCausalLM(config))
    assert ort_warnings == [] and [str(w.message) for w in raised] == []
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    assert ort_run_record(model)["training"]["session"], "the model did not run in ORT"


def test_a_collision_with_the_users_own_method_is_still_warned_of(enabled: None, ort_warnings: list[str]) -> None:
    from onnxruntime.training.ortmodule import ORTModule

    ORTModule(OwnTo())
    assert [message for message in ort_warnings if console.COLLISION in message] == [
        "User Module's attribute name to collides with ORTModule's attribute name. User Module's method may not be "
        "called upon invocation through ORTModule."
    ]
