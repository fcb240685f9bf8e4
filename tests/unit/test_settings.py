"""The settings read from the environment reject what they do not understand, naming the variable."""

from __future__ import annotations

import pytest

from ort_zero import settings


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("0", False), ("", True), (" 0 ", False)])
def test_trim_after_backward_reads_its_variable(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("ORT_ZERO_TRIM_AFTER_BACKWARD", raw)
    assert settings.trim_after_backward() is expected


def test_trim_after_backward_is_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORT_ZERO_TRIM_AFTER_BACKWARD", raising=False)
    assert settings.trim_after_backward() is True


def test_a_bad_trim_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORT_ZERO_TRIM_AFTER_BACKWARD", "yes")
    with pytest.raises(ValueError, match="ORT_ZERO_TRIM_AFTER_BACKWARD='yes'"):
        settings.trim_after_backward()
