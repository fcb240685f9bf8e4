"""DeepSpeed's `latest` tag is replaced atomically: the old tag or the new one, never a part, nothing left beside."""

from __future__ import annotations

from pathlib import Path

from ort_zero.zero3.saving import write_atomically


def test_latest_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path: Path) -> None:
    latest = tmp_path / "latest"
    write_atomically(latest, "global_step2")
    write_atomically(latest, "global_step4")
    assert latest.read_text() == "global_step4"
    assert [path.name for path in tmp_path.iterdir()] == ["latest"]
