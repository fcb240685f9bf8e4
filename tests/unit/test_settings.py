"""The settings read from the environment reject what they do not understand, naming the variable."""

from __future__ import annotations

import pytest

from ort_zero import settings


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("0", False), ("", True), (" 0 ", False)])
def test_trim_heap_reads_its_variable(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("ORT_ZERO_TRIM_HEAP", raw)
    assert settings.trim_heap() is expected


def test_trim_heap_is_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORT_ZERO_TRIM_HEAP", raising=False)
    assert settings.trim_heap() is True


def test_a_bad_trim_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORT_ZERO_TRIM_HEAP", "yes")
    with pytest.raises(ValueError, match="ORT_ZERO_TRIM_HEAP='yes'"):
        settings.trim_heap()
