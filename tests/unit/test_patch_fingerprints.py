"""A patch outside its tested versions (ort_zero.patching): it applies where the code it replaces is the code it
was tested against (same fingerprint), and refuses, in one line naming the model types and the symbol, where that
code changed or is gone. The recorded fingerprints (ort_zero/foreign/fingerprints.py) match the installed
transformers."""

from __future__ import annotations

import sys
import types
from importlib.metadata import version

import pytest
from packaging.specifiers import SpecifierSet

from ort_zero import patches, patching
from ort_zero.declaration import Declaration
from ort_zero.foreign.fingerprints import TESTED_SOURCES
from ort_zero.foreign.versions import TESTED, TRANSFORMERS_VERSIONS
from ort_zero.patches import Patch, UnsupportedVersionError

MODULE = "ort_zero_fingerprint_target"
UNTESTED = "<0"  # no installed `packaging` is in it: every check goes by fingerprint


def rotary(x: int) -> int:
    return x + 1


def rotary_changed(x: int) -> int:
    return x + 2


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A module whose `rotary` is this file's `rotary`, and an empty registry."""
    module = types.ModuleType(MODULE)
    module.rotary = rotary
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(patching, "_REGISTRY", {})
    monkeypatch.setattr(patching, "_GROUPS", {})
    return module


def declare(attribute: str, fingerprints: tuple[str, ...]) -> Patch:
    declaration = Declaration(
        "test.rotary_in_export", f"{MODULE}.{attribute}", "test", lambda replaced: lambda x: -x,
        ("llama4", "llama4_text"),
    )  # fmt: skip
    patch = Patch(declaration, "packaging", UNTESTED, fingerprints=fingerprints)
    return patches.register(patch, "export_test")


def test_outside_the_tested_versions_unchanged_code_is_patched(target: types.ModuleType) -> None:
    declare("rotary", (patching.fingerprint(rotary),))
    with patches.applied("export_test"):
        assert target.rotary(3) == -3
    assert target.rotary is rotary


def test_outside_the_tested_versions_changed_code_refuses_naming_the_family_and_symbol(
    target: types.ModuleType,
) -> None:
    declare("rotary", (patching.fingerprint(rotary),))
    target.rotary = rotary_changed  # what a new transformers release would bring
    with pytest.raises(UnsupportedVersionError) as raised:
        patches.apply_group("export_test")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"ort_zero cannot export llama4, llama4_text models with packaging {version('packaging')}"
    )
    assert f"{MODULE}.rotary, which its patch 'test.rotary_in_export' replaces, has changed" in message
    assert "pip install 'packaging<0'" in message
    assert target.rotary is rotary_changed and not patches.is_applied("test.rotary_in_export")


def test_outside_the_tested_versions_a_removed_symbol_refuses(target: types.ModuleType) -> None:
    declare("rotary", (patching.fingerprint(rotary),))
    del target.rotary
    with pytest.raises(UnsupportedVersionError, match=f"{MODULE}.rotary, which .* replaces, is gone since"):
        patches.apply_group("export_test")


def test_an_applied_patch_is_checked_against_what_it_replaced(target: types.ModuleType) -> None:
    """`ort-zero doctor` checks patches that may be applied: the replacement must not count as changed code."""
    patch = declare("rotary", (patching.fingerprint(rotary),))
    with patches.applied("export_test"):
        patch.check_version()


def test_fingerprints_ignore_indentation_and_tell_code_apart() -> None:
    class Holder:
        def rotary(x: int) -> int:
            return x + 1

    assert patching.fingerprint(Holder.rotary) == patching.fingerprint(rotary)
    assert patching.fingerprint(staticmethod(rotary)) == patching.fingerprint(rotary)  # as a class stores it
    assert patching.fingerprint(rotary_changed) != patching.fingerprint(rotary)
    assert patching.fingerprint(len) is None  # no Python source: never equal to a recorded one


def test_every_transformers_patch_has_the_installed_releases_fingerprint() -> None:
    """The record is complete, and the installed transformers (a tested one) hashes as recorded: when a new release
    is tested, `python -m ort_zero.tools.fingerprints` prints what to add."""
    installed = version("transformers")
    assert installed in TESTED["transformers"] and installed in SpecifierSet(TRANSFORMERS_VERSIONS)
    declared = [patch for patch in patches.registered() if patch.distribution == "transformers"]
    assert {patch.name for patch in declared} == set(TESTED_SOURCES)
    for patch in declared:
        assert patch.family and patch.fingerprints == TESTED_SOURCES[patch.name]
        assert patching.fingerprint(patch.current()) in patch.fingerprints, (patch.name, installed)
