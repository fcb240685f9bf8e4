"""How ort_zero's patches work: a registry of replaced attributes, applied and reverted by name, in groups, each
recording the original object so that reverting restores it exactly. The declarations are in `ort_zero.patches`."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import logging
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .declaration import Declaration

logger = logging.getLogger(__name__)


class UnsupportedVersionError(RuntimeError):
    """A package ort_zero patches is at a version the patch was not written for."""


@dataclass
class Patch:
    """A declaration that replaces an attribute (`declaration.target`), guarded by the versions of the distribution
    it was written for, and what applying it did."""

    declaration: Declaration
    distribution: str  # the pip distribution whose version guards the patch
    versions: str  # PEP 440 specifier the patch was written and tested for
    adds: bool = False  # the owner may lack the attribute (a name torch moved): added, and removed on revert
    # Outside `versions` the patch still applies where what it replaces hashes (`fingerprint`) as one of these, seen
    # in the tested versions; with none it refuses there.
    fingerprints: tuple[str, ...] = ()
    # What the replacement registers in another package's registry (an op's export symbolic, an op's gradient): a
    # declaration each, listed as rows of their own (docs/patches.md), applied and reverted with this patch.
    registers: tuple[Declaration, ...] = ()
    original: Any = field(default=None, repr=False)
    owned: bool = False  # the attribute was defined on the owner itself, not inherited
    applied: bool = False

    @property
    def name(self) -> str:
        return self.declaration.name

    @property
    def owner_path(self) -> str:
        return self.declaration.owner_and_attribute()[0]

    @property
    def attribute(self) -> str:
        return self.declaration.owner_and_attribute()[1]

    @property
    def reason(self) -> str:
        return self.declaration.reason

    @property
    def family(self) -> str:
        """The model types that need the patch, named where it refuses."""
        return ", ".join(self.declaration.needed_by)

    def make_replacement(self, original: Any) -> Any:
        return self.declaration.factory(original)

    def owner(self) -> Any:
        module_name, _, class_name = self.owner_path.partition(":")
        owner = importlib.import_module(module_name)
        for part in filter(None, class_name.split(".")):
            owner = getattr(owner, part)
        return owner

    def current(self) -> Any:
        """What applying the patch replaces now: the owner's own attribute as stored (a staticmethod as such), else
        the inherited one, else None for a patch that adds the attribute."""
        owner = self.owner()
        if self.attribute in vars(owner):
            return vars(owner)[self.attribute]
        return getattr(owner, self.attribute, None) if self.adds else getattr(owner, self.attribute)

    def check_version(self) -> None:
        installed = Version(installed_version(self.distribution))
        if installed in SpecifierSet(self.versions):
            return
        if not self.fingerprints:
            raise UnsupportedVersionError(
                f"ort_zero patch '{self.name}' replaces {self.owner_path}.{self.attribute} and supports "
                f"{self.distribution}{self.versions}, but {self.distribution} {installed} is installed. "
                f"Install a supported version (pip install '{self.distribution}{self.versions}') or run "
                f"'ort-zero doctor'."
            )
        try:
            found, change = fingerprint(self.original if self.applied else self.current()), "has changed"
        except (ImportError, AttributeError):
            found, change = None, "is gone"
        if found is None or found not in self.fingerprints:
            subject = f"export {self.family} models" if self.family else f"apply its patch '{self.name}'"
            raise UnsupportedVersionError(
                f"ort_zero cannot {subject} with {self.distribution} {installed}: "
                f"{self.owner_path}.{self.attribute}, which its patch '{self.name}' replaces, {change} since the "
                f"versions tested ({self.distribution}{self.versions}). Install one of those "
                f"(pip install '{self.distribution}{self.versions}') or run 'ort-zero doctor'."
            )


def fingerprint(symbol: Any) -> str | None:
    """A hash of a function's or class's source (as a class stores it: a staticmethod's function), or None for an
    object without Python source. Equal hashes: the code a patch replaces is the code it was tested against."""
    try:
        source = inspect.getsource(getattr(symbol, "__func__", symbol))
    except (OSError, TypeError):
        return None
    return hashlib.sha256(textwrap.dedent(source).encode()).hexdigest()[:16]


@functools.cache
def installed_version(distribution: str) -> str:
    """Read once per process: every export applies its patch groups again (48 reads of package metadata, 0.05 s)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError as error:
        raise UnsupportedVersionError(f"{distribution} is not installed; ort_zero needs it.") from error


_REGISTRY: dict[str, Patch] = {}  # the declarations, made once at import: the process is their lifetime
_GROUPS: dict[str, list[str]] = {}
_LOCK = threading.Lock()


def register(patch: Patch, group: str) -> Patch:
    """Declare a patch; it changes nothing until its group is applied."""
    if patch.name in _REGISTRY:
        raise ValueError(f"patch '{patch.name}' is declared twice")
    _REGISTRY[patch.name] = patch
    _GROUPS.setdefault(group, []).append(patch.name)
    return patch


def _names_in(group: str) -> list[str]:
    """The patches of `group` (a name of `ort_zero.patch_groups`, or a model rewrite's); an error for any other."""
    if group not in _GROUPS:
        raise ValueError(f"ort_zero: no patch group '{group}' is declared (declared: {', '.join(sorted(_GROUPS))})")
    return _GROUPS[group]


def apply_group(group: str) -> None:
    """Apply every patch of a group; all-or-nothing, idempotent."""
    with _LOCK:
        names = _names_in(group)
        patches = [_REGISTRY[name] for name in names]
        for patch in patches:
            patch.check_version()
        done: list[Patch] = []
        try:
            for patch in patches:
                if not patch.applied:
                    _apply(patch)
                    done.append(patch)
        except Exception:
            for patch in reversed(done):
                _revert(patch)
            raise


def revert_group(group: str) -> None:
    """Restore every original of a group, in reverse order of application."""
    with _LOCK:
        for name in reversed(_names_in(group)):
            patch = _REGISTRY[name]
            if patch.applied:
                _revert(patch)


@contextlib.contextmanager
def applied(group: str) -> Iterator[None]:
    """A group's patches for the duration of a block; patches already applied stay applied afterwards."""
    already = {name for name in _names_in(group) if _REGISTRY[name].applied}
    apply_group(group)
    try:
        yield
    finally:
        with _LOCK:
            for name in reversed(_names_in(group)):
                if name not in already and _REGISTRY[name].applied:
                    _revert(_REGISTRY[name])


def is_applied(name: str) -> bool:
    return _REGISTRY[name].applied


def original(name: str) -> Any:
    """The object a patch replaced; patched code calls through it to keep DeepSpeed/ORT behaviour it does not own."""
    patch = _REGISTRY[name]
    if not patch.applied:
        raise RuntimeError(f"patch '{name}' is not applied")
    return patch.original


def registered() -> list[Patch]:
    return list(_REGISTRY.values())


def groups() -> dict[str, list[Patch]]:
    """Every group's patches, in the order they apply."""
    return {group: [_REGISTRY[name] for name in names] for group, names in _GROUPS.items()}


def _apply(patch: Patch) -> None:
    owner = patch.owner()
    patch.owned = patch.attribute in vars(owner)
    patch.original = patch.current()
    setattr(owner, patch.attribute, patch.make_replacement(patch.original))
    patch.applied = True
    logger.debug("ort_zero: patched %s.%s (%s)", patch.owner_path, patch.attribute, patch.name)


def _revert(patch: Patch) -> None:
    if patch.owned:
        setattr(patch.owner(), patch.attribute, patch.original)
    else:
        delattr(patch.owner(), patch.attribute)
    patch.original = None
    patch.applied = False
