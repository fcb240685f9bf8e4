"""`ort-zero configs`: lists the shipped configs, copies them, and never overwrites a user's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ort_zero import configs
from ort_zero.cli.main import main


def test_it_lists_where_the_configs_are_and_their_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"# {configs.folder()}", *configs.names()]


def test_a_copy_is_each_config_and_a_second_copy_overwrites_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["configs", "--copy", str(tmp_path)]) == 0
    for name in configs.names():
        assert (tmp_path / name).read_bytes() == configs.shipped(name).read_bytes()
    (tmp_path / "zero3_hf_auto.json").write_text(json.dumps({"mine": True}))
    assert main(["configs", "--copy", str(tmp_path)]) == 1
    assert "already has" in capsys.readouterr().err
    assert json.loads((tmp_path / "zero3_hf_auto.json").read_text()) == {"mine": True}
