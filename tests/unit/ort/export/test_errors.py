"""Export failures name the module and the way out; an allowed fallback is announced, not silent."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator

import pytest
import torch

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")


class Unexportable(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigh(x @ x.transpose(-1, -2)).eigenvalues  # no ONNX equivalent


class Outer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.inner = torch.nn.Sequential(torch.nn.Identity(), Unexportable())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.proj(x)).sum()


@pytest.fixture
def enabled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    ort_zero.enable_zero3()
    yield
    ort_zero.disable_zero3()


def test_export_error_names_the_module_and_the_way_out(enabled: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    model = ortmodule.ORTModule(Outer())
    with pytest.raises(Exception) as raised:
        model(torch.randn(2, 4, requires_grad=True))
    message = str(raised.value)
    assert "failed in module 'inner.1' (Unexportable)" in message, message
    assert "Ways out" in message


def test_allowed_fallback_is_announced(enabled: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_UNSUPPORTED_ONNX_MODEL")
    model = ortmodule.ORTModule(Outer())
    with pytest.warns(RuntimeWarning, match="FELL BACK TO PYTORCH"):
        result = model(torch.randn(2, 4, requires_grad=True))
    assert torch.isfinite(result)


def test_enable_zero3_disables_silent_fallback_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORTMODULE_FALLBACK_POLICY", raising=False)
    ort_zero.enable_zero3()
    try:
        assert os.environ["ORTMODULE_FALLBACK_POLICY"] == "FALLBACK_DISABLE"
    finally:
        ort_zero.disable_zero3()
