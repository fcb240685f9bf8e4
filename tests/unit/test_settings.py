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


@pytest.mark.parametrize("variable", ["ORT_ZERO_TRIM_HEAP", "ORT_ZERO_OUTPUT_POOL", "ORT_ZERO_CPU_MEM_ARENA"])
def test_a_bad_switch_stops_enable_zero3_naming_it(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    import ort_zero

    monkeypatch.setenv(variable, "yes")
    enabled = ort_zero.is_zero3_enabled()
    with pytest.raises(ValueError, match=f"{variable}='yes'"):
        ort_zero.enable_zero3()
    assert ort_zero.is_zero3_enabled() == enabled  # stopped before patching anything


def test_the_output_pool_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORT_ZERO_OUTPUT_POOL", raising=False)
    assert settings.output_pool() is True
    monkeypatch.setenv("ORT_ZERO_OUTPUT_POOL", "1")
    assert settings.output_pool() is True
    monkeypatch.setenv("ORT_ZERO_OUTPUT_POOL", "0")
    assert settings.output_pool() is False


@pytest.mark.parametrize(("raw", "expected"), [(None, None), ("", None), ("1", True), ("0", False)])
def test_the_cpu_arena_is_left_to_ort_zero_unless_set(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: bool | None
) -> None:
    if raw is None:
        monkeypatch.delenv("ORT_ZERO_CPU_MEM_ARENA", raising=False)
    else:
        monkeypatch.setenv("ORT_ZERO_CPU_MEM_ARENA", raw)
    assert settings.cpu_mem_arena() is expected
