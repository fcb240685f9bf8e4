"""ort_zero.patches on a throwaway module: exact restore, all-or-nothing, version guard, idempotence.

The registry is global, so every test gets an empty one; DeepSpeed and ONNX Runtime are never touched.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from importlib.metadata import version
from typing import Any

import pytest

from ort_zero import patches, patching
from ort_zero.declaration import Declaration
from ort_zero.patches import Patch, UnsupportedVersionError

MODULE = "ort_zero_test_target"


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A fresh importable module with a function, a class with several kinds of attribute, and a nested class."""
    module = types.ModuleType(MODULE)

    def greet() -> str:
        return "original"

    class Base:
        def inherited(self) -> str:
            return "base"

    class Target(Base):
        def method(self) -> str:
            return "method"

        @staticmethod
        def static() -> str:
            return "static"

        class Inner:
            value = 1

    module.greet = greet
    module.Base = Base
    module.Target = Target
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.setattr(patching, "_REGISTRY", {})
    monkeypatch.setattr(patching, "_GROUPS", {})
    return module


def declare(
    name: str,
    owner: str,
    attribute: str,
    replacement: Any = None,
    *,
    group: str = "g",
    versions: str = ">=0",
    distribution: str = "packaging",
) -> Patch:
    """Register a patch whose replacement is `replacement`, or a function returning "patched <name>"."""

    def make(original: Any) -> Any:
        return replacement if replacement is not None else (lambda *a, **k: f"patched {name}")

    return patches.register(
        Patch(Declaration(name, f"{owner}.{attribute}", "test", make), distribution, versions), group
    )


def test_apply_then_revert_restores_the_exact_originals(target: types.ModuleType) -> None:
    originals = {"greet": target.greet, "method": target.Target.__dict__["method"]}
    static = target.Target.__dict__["static"]
    declare("f", MODULE, "greet")
    declare("m", f"{MODULE}:Target", "method")
    declare("s", f"{MODULE}:Target", "static")
    declare("n", f"{MODULE}:Target.Inner", "value", replacement=2)

    patches.apply_group("g")
    assert target.greet() == "patched f"
    assert target.Target().method() == "patched m"
    assert target.Target.Inner.value == 2
    assert patches.original("f") is originals["greet"]
    assert patches.original("s") is static, "the staticmethod descriptor itself must be kept, not the function"

    patches.revert_group("g")
    assert target.greet is originals["greet"]
    assert target.Target.__dict__["method"] is originals["method"]
    assert target.Target.__dict__["static"] is static
    assert target.Target.Inner.value == 1
    assert not any(patches.is_applied(n) for n in "fmsn")
    with pytest.raises(RuntimeError, match="not applied"):
        patches.original("f")


def test_stacked_patches_on_one_attribute_revert_to_the_first_original(target: types.ModuleType) -> None:
    original = target.greet
    declare("first", MODULE, "greet")
    declare("second", MODULE, "greet")
    patches.apply_group("g")
    assert target.greet() == "patched second"
    assert patches.original("second")() == "patched first"
    patches.revert_group("g")
    assert target.greet is original


def test_revert_of_an_inherited_attribute_leaves_the_subclass_unchanged(target: types.ModuleType) -> None:
    declare("i", f"{MODULE}:Target", "inherited")
    patches.apply_group("g")
    assert target.Target().inherited() == "patched i"
    patches.revert_group("g")
    assert "inherited" not in target.Target.__dict__


def test_apply_is_idempotent(target: types.ModuleType) -> None:
    original = target.greet
    given: list[Any] = []

    def wrap(inner: Any) -> Any:
        given.append(inner)
        return lambda: "wrapped " + inner()

    patches.register(Patch(Declaration("f", f"{MODULE}.greet", "test", wrap), "packaging", ">=0"), "g")
    patches.apply_group("g")
    patches.apply_group("g")
    assert target.greet() == "wrapped original"
    assert given == [original], "a second apply must not wrap the replacement again"
    patches.revert_group("g")
    patches.revert_group("g")
    assert target.greet is original


def test_a_failing_patch_leaves_nothing_applied(target: types.ModuleType) -> None:
    original = target.greet

    def explode(original: Any) -> Any:
        raise RuntimeError("factory failed")

    declare("ok", MODULE, "greet")
    patches.register(Patch(Declaration("bad", f"{MODULE}:Target.method", "test", explode), "packaging", ">=0"), "g")
    with pytest.raises(RuntimeError, match="factory failed"):
        patches.apply_group("g")
    assert target.greet is original
    assert not patches.is_applied("ok") and not patches.is_applied("bad")


def test_a_missing_attribute_leaves_nothing_applied(target: types.ModuleType) -> None:
    original = target.greet
    declare("ok", MODULE, "greet")
    declare("missing", f"{MODULE}:Target", "no_such_attribute")
    with pytest.raises(AttributeError):
        patches.apply_group("g")
    assert target.greet is original and not patches.is_applied("ok")


def test_version_guard_names_the_supported_range_and_applies_nothing(target: types.ModuleType) -> None:
    original = target.greet
    declare("ok", MODULE, "greet")
    declare("old", f"{MODULE}:Target", "method", versions="<1.0")
    with pytest.raises(UnsupportedVersionError) as raised:
        patches.apply_group("g")
    message = str(raised.value)
    assert "packaging<1.0" in message and version("packaging") in message and "'old'" in message
    assert target.greet is original and not patches.is_applied("ok")


def test_version_guard_reports_a_missing_distribution(target: types.ModuleType) -> None:
    declare("ghost", MODULE, "greet", distribution="ort-zero-no-such-distribution")
    with pytest.raises(UnsupportedVersionError, match="ort-zero-no-such-distribution is not installed"):
        patches.apply_group("g")


def test_groups_are_independent_and_names_unique(target: types.ModuleType) -> None:
    declare("f", MODULE, "greet", group="one")
    declare("m", f"{MODULE}:Target", "method", group="two")
    patches.apply_group("one")
    assert patches.is_applied("f") and not patches.is_applied("m")
    assert [p.name for p in patches.registered()] == ["f", "m"]
    with pytest.raises(ValueError, match="declared twice"):
        declare("f", MODULE, "greet", group="two")
    patches.revert_group("one")


def test_a_group_no_patch_declares_is_refused(target: types.ModuleType) -> None:
    """A misspelt group name applied nothing, silently: now it names the groups there are."""
    declare("f", MODULE, "greet")
    for use in (patches.apply_group, patches.revert_group, lambda group: patches.applied(group).__enter__()):
        with pytest.raises(ValueError, match="no patch group 'gg' is declared .*g"):
            use("gg")
    assert not patches.is_applied("f")


def test_the_package_applies_its_groups_by_the_names_it_declares() -> None:
    """Every group name in `ort_zero.patch_groups` has patches declared under it, and no other name does except the
    model rewrites' own groups."""
    from ort_zero import patch_groups
    from ort_zero.ort.export.rewrites import REWRITES

    named = {value for name, value in vars(patch_groups).items() if name.isupper()}
    declared = set(patches.groups())
    assert named <= declared, named - declared
    assert declared - named == {rewrite.group for rewrite in REWRITES}


def test_importing_patches_imports_neither_deepspeed_nor_onnxruntime() -> None:
    """The declarations must stay lazy: `ort-zero doctor` and the PyTorch path rely on it."""
    code = "import sys, ort_zero.patches; print(any(m in sys.modules for m in ('deepspeed', 'onnxruntime')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_every_declared_replacement_builds_against_the_installed_stack() -> None:
    """Each factory finds the code it names (a rename in ort_zero or in the patched package fails here, not when a
    user's run applies the patch) and builds a replacement from what it replaces, without installing it."""
    declared = patches.registered()
    assert len(declared) >= 20, [patch.name for patch in declared]
    for patch in declared:
        if patch.distribution == "trl" and importlib.util.find_spec("trl") is None:
            continue  # an optional integration (ort_zero.integrations.trl), applied only when TRL is used
        patch.check_version()
        assert patch.make_replacement(patch.current()) is not None, patch.name
