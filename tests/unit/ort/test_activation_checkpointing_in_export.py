"""Users' checkpoints and ORTModule: ORT's own checkpoint wrappers stay out of a ZeRO-3 export, and the level-0
refusal reaches the caller as itself, through ORTModule's export and fallback handling, leaving nothing patched.
(The policy: tests/unit/zero3/test_activation_checkpointing.py.)"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator

import deepspeed
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero import patches, settings  # noqa: E402
from ort_zero.zero3 import activation_checkpointing  # noqa: E402

ORT_SAYS = "Layer-wise memory optimization is enabled"  # what ORT's wrapper prints when it acts


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(activation_checkpointing, "_announced", False)
    monkeypatch.setattr(activation_checkpointing, "_pending", None)


@pytest.mark.parametrize("through", ["torch attribute", "Hugging Face's partial", "deepspeed attribute"])
def test_orts_wrappers_hand_the_call_to_ort_zero_during_a_zero3_export(
    fresh: None, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], through: str
) -> None:
    """At ORTMODULE_MEMORY_OPT_LEVEL=1 inside ORT's export, ORT's wrapper would print and run the function itself
    (checked first); in a ZeRO-3 export it hands the call on, and ort_zero's policy runs it (to be announced)."""
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "1")
    monkeypatch.setattr(settings, "recompute_level_override", None)
    bound_by_hugging_face = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=True)  # ORT's
    call = {
        "torch attribute": lambda f, x: torch.utils.checkpoint.checkpoint(f, x, use_reentrant=True),
        "Hugging Face's partial": bound_by_hugging_face,
        "deepspeed attribute": lambda f, x: deepspeed.checkpointing.checkpoint(f, x),
    }[through]
    layer, x = nn.Linear(2, 2), torch.randn(3, 2, requires_grad=True)
    with ortmodule.export_context():
        call(layer, x)
        assert ORT_SAYS in capfd.readouterr().out, "ORT's wrapper did not act: the test proves nothing"
        with patches.applied("ort_export"):
            call(layer, x)
        assert ortmodule.ORTMODULE_ONNX_EXPORT_CONTEXT == [True], "ORT's own flag was not restored"
    assert ORT_SAYS not in capfd.readouterr().out
    assert activation_checkpointing._pending == 1


class CheckpointedZeRO3(nn.Module):
    """Parameters marked as ZeRO-3's (ds_id), so ORTModule exports it as a ZeRO-3 model; no engine needed: the
    refusal comes before anything is gathered."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        for ds_id, param in enumerate(self.parameters()):
            param.ds_id = ds_id

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.layer, x, use_reentrant=True).sum()


@pytest.fixture
def enabled() -> Iterator[None]:
    ort_zero.enable_zero3()
    yield
    ort_zero.disable_zero3()


@pytest.mark.parametrize("policy", ["FALLBACK_DISABLE", "FALLBACK_UNSUPPORTED_ONNX_MODEL"])
def test_the_refusal_reaches_the_caller_unwrapped_and_leaves_nothing_patched(
    enabled: None, fresh: None, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """ORT wraps an export error and chains its traceback, or falls back to PyTorch when allowed; the refusal is
    neither: the user chose no recompute for a checkpointed model, and the run stops."""
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", policy)
    monkeypatch.setattr(settings, "recompute_level_override", 0)
    model = ortmodule.ORTModule(CheckpointedZeRO3())
    with pytest.raises(activation_checkpointing.CheckpointingRefused) as refused:
        model(torch.randn(3, 2, requires_grad=True))
    assert refused.value.__cause__ is None and "\n" not in str(refused.value)[:-1]
    assert not torch.onnx.is_in_onnx_export()
    assert not [p.name for p in patches.registered() if p.applied and p.name.endswith("_in_export")]
