"""docs/patches.md's table is the declarations' (`ort_zero.tools.patch_table`): a reason is written once."""

from __future__ import annotations

from pathlib import Path

import pytest

from ort_zero import patches
from ort_zero.tools import patch_table

PAGE = Path(__file__).parents[3] / "docs" / "patches.md"


def test_the_page_shows_every_declaration_as_declared() -> None:
    page = PAGE.read_text()
    regenerate = "regenerate it: python -m ort_zero.tools.patch_table --write docs/patches.md"
    assert patch_table.with_table(page) == page, regenerate
    for patch in patches.registered():
        assert f"`{patch.owner_path.replace(':', '.')}.{patch.attribute}`" in page, patch.name


def test_every_op_override_and_gradient_is_a_row() -> None:
    """The aten overrides and ORT gradients one patch registers each, listed under it, with their reasons."""
    from ort_zero.ort.export.gradients import GRADIENTS
    from ort_zero.ort.export.overrides import OVERRIDES

    rows = patch_table.table().splitlines()
    for declaration in (*OVERRIDES, *GRADIENTS):
        row = next((row for row in rows if f"| `{declaration.target}`, through" in row), None)
        assert row is not None, declaration.name
        assert declaration.reason.split(":")[0] in row


def test_a_page_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="no generated table"):
        patch_table.with_table("# a page\n")
