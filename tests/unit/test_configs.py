"""The shipped configs are found through the package, and a command line's config falls back to them by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ort_zero
from ort_zero import configs

ROOT = Path(ort_zero.__file__).resolve().parents[1]


def test_the_checkouts_ds_configs_are_the_packages() -> None:
    assert (ROOT / "ds_configs").resolve() == configs.folder().resolve()
    assert "zero3_hf_auto.json" in configs.names() and "accelerate_zero3_cpu.yaml" in configs.names()


def test_a_file_that_exists_is_taken_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "ds_configs" / "zero3_hf_auto.json"
    mine.parent.mkdir()
    mine.write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert configs.resolve("ds_configs/zero3_hf_auto.json") == Path("ds_configs/zero3_hf_auto.json")


@pytest.mark.parametrize("argument", ["ds_configs/zero3_hf_auto.json", "zero3_hf_auto.json"])
def test_elsewhere_a_shipped_name_is_the_shipped_config(
    argument: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert not os.path.exists(argument)
    assert configs.resolve(argument) == configs.shipped("zero3_hf_auto.json")


@pytest.mark.parametrize("argument", ["runs/zero3_hf_auto.json", "ds_configs/mine.json"])
def test_other_missing_paths_stay_as_given(argument: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another folder's file, or a name ort_zero does not ship: the caller's 'not found' names what was asked."""
    monkeypatch.chdir(tmp_path)
    assert configs.resolve(argument) == Path(argument)


def test_an_unknown_shipped_name_lists_the_shipped_ones() -> None:
    with pytest.raises(FileNotFoundError, match="zero3_hf_auto.json"):
        configs.shipped("zero4.json")
