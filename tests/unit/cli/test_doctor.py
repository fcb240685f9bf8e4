"""`ort-zero` dispatch and `ort-zero doctor`: lazy subcommands, guarded probes, pins, the real console script."""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ort_zero.cli import doctor, main
from ort_zero.declaration import Declaration
from ort_zero.stack import cuda_libraries


def test_only_the_chosen_subcommand_is_imported() -> None:
    code = (
        "import sys; from ort_zero.cli import main; main.build_parser('doctor'); "
        "print(sorted(m for m in sys.modules if m.startswith('ort_zero.cli.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    doctor = ["ort_zero.cli.doctor", "ort_zero.cli.doctor_cuda", "ort_zero.cli.doctor_report", "ort_zero.cli.main"]
    assert result.stdout.strip() == str(doctor)


def test_a_subcommand_that_cannot_import_fails_cleanly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(main.COMMANDS, "broken", "a subcommand whose module does not exist")
    assert main.main(["broken"]) == 2
    assert "Run 'ort-zero doctor'" in capsys.readouterr().err


def test_every_subcommand_is_listed_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main.main(["--help"])
    help_text = capsys.readouterr().out
    assert all(name in help_text for name in ("doctor", "compare", "converge"))


def stub_probes(monkeypatch: pytest.MonkeyPatch, **overrides: object) -> None:
    """Replace the slow probes (they import torch, ORT, DeepSpeed) with canned lines unless overridden."""
    for name in ("torch_line", "ort_line", "deepspeed_line", "onnx_line", "mpi_line"):
        monkeypatch.setattr(doctor, name, overrides.get(name, lambda report, pins, n=name: f"fine ({n})"))
    monkeypatch.setattr(doctor, "cuda_lines", overrides.get("cuda_lines", lambda report: "fine (cuda_lines)"))


def test_a_failing_probe_is_printed_and_the_rest_still_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(report: doctor.Report, pins: object) -> str:
        raise ImportError("libtorch_cpu.so: cannot open shared object file\nsecond line")

    stub_probes(monkeypatch, torch_line=broken)
    monkeypatch.setattr(doctor, "SUPPORTED_PYTHON", sys.version_info[:2])
    assert doctor.run(argparse.Namespace()) == 1
    out = capsys.readouterr().out
    assert "torch:                ERROR ImportError: libtorch_cpu.so: cannot open shared object file\n" in out
    assert "fine (mpi_line)" in out and "ort_zero patches:" in out
    assert out.splitlines()[-1].startswith("verdict:              NOT supported: torch failed (ImportError")


def test_all_probes_fine_is_supported(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    stub_probes(monkeypatch)
    monkeypatch.setattr(doctor, "SUPPORTED_PYTHON", sys.version_info[:2])
    monkeypatch.setattr(doctor, "patch_lines", lambda report: "none")
    assert doctor.run(argparse.Namespace()) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "verdict:              supported"


def test_wrong_python_is_not_supported(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    stub_probes(monkeypatch)
    monkeypatch.setattr(doctor, "SUPPORTED_PYTHON", (2, 7))
    assert doctor.run(argparse.Namespace()) == 1
    assert "is not 2.7" in capsys.readouterr().out


def test_a_version_outside_its_pin_is_a_problem() -> None:
    report = doctor.Report()
    installed = metadata.version("packaging")
    pins = {"packaging": Requirement("packaging==0.0.1")}
    assert doctor.check_pin(report, pins, "packaging") == f"{installed} (supported: ==0.0.1)"
    assert report.problems == [f"packaging {installed} is not packaging==0.0.1"]
    assert doctor.check_pin(report, {}, "ort-zero-no-such-distribution") == "not installed"
    assert report.problems[-1] == "ort-zero-no-such-distribution is not installed"


def test_pins_come_from_setup_py_whether_installed_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = doctor.pins()
    assert set(installed) == set(doctor.CHECKED)

    def not_installed(name: str) -> list[str]:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(doctor.metadata, "requires", not_installed)
    assert {name: str(r) for name, r in doctor.pins().items()} == {name: str(r) for name, r in installed.items()}


def test_console_script_on_this_machine() -> None:
    """The real thing: every component probed; this environment is the supported one."""
    script = Path(sys.executable).parent / "ort-zero"
    result = subprocess.run([str(script), "doctor"], capture_output=True, text=True, timeout=300)
    labels = [line.split(":")[0] for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    for label in ("python", "torch", "onnxruntime-training", "deepspeed", "onnx", "mpi4py", "ort_zero patches", "cuda"):
        assert label in labels, result.stdout
    assert "extensions built and load" in result.stdout, result.stdout
    assert result.stdout.splitlines()[-1] == "verdict:              supported", result.stdout + result.stderr
    assert result.returncode == 0


def test_cuda_side_names_a_missing_library_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for (ORT_ZERO_CUDA=1) with nothing installed: every missing library is a problem with its command."""
    monkeypatch.setenv("ORT_ZERO_CUDA", "1")
    monkeypatch.setenv("ORT_ZERO_CUDA_HOME", str(tmp_path))
    report = doctor.Report()
    lines = doctor.cuda_lines(report)
    assert "libonnxruntime_providers_cuda.so needs libcudnn.so.8: NOT FOUND" in lines
    assert any("libcudnn.so.8 (needed by libonnxruntime_providers_cuda.so)" in p for p in report.problems)
    assert all("'ORT_ZERO_CUDA=1 launch/bootstrap.sh'" in p for p in report.problems)


def test_cuda_side_without_a_driver_checks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORT_ZERO_CUDA", raising=False)
    monkeypatch.setattr(cuda_libraries, "driver_present", lambda: False)
    report = doctor.Report()
    assert doctor.cuda_lines(report)[0].startswith("no NVIDIA driver (libcuda.so.1 not found)")
    assert report.problems == []


def test_what_torch_deprecates_on_ort_zeros_route_is_said_by_the_doctor() -> None:
    """Runs no longer say it (ort_zero.ort.ortmodule.torch_compat, ort_zero.distributed): the doctor does, once."""
    import torch.distributed as dist

    from ort_zero.cli.doctor import Report, torch_line

    line = torch_line(Report(), {})
    assert "torch deprecates ORT's exporter" in line
    for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):  # torch 2.14 deprecates them, 2.15 does not
        assert (name in line) == hasattr(getattr(dist, name), "__deprecated__"), line


def test_tested_versions_say_whether_the_installed_one_is_among_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from ort_zero.foreign import versions

    installed = metadata.version("packaging")
    monkeypatch.setattr(versions, "TESTED", {"packaging": ("0.0.1", installed), "ort-zero-no-such-distribution": ()})
    report = doctor.Report()
    assert doctor.tested_lines(report) == [f"packaging {installed}: tested (tested: 0.0.1, {installed})"]
    monkeypatch.setattr(versions, "TESTED", {"packaging": ("0.0.1",)})
    assert doctor.tested_lines(report) == [f"packaging {installed}: NOT tested (tested: 0.0.1)"]
    assert report.problems == []  # the ranges and the patches judge, not this list


def test_a_patch_of_a_package_not_installed_is_no_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """An optional integration's patch (TRL's) where that package is absent: said, not counted against the stack."""
    from ort_zero import patching

    monkeypatch.setattr(patching, "_REGISTRY", {})
    monkeypatch.setattr(patching, "_GROUPS", {})
    package = "ort-zero-no-such-distribution"
    patching.register(patching.Patch(Declaration("absent", "json.dumps", "test", lambda f: f), package, ">=1"), "g")
    report = doctor.Report()
    lines = doctor.patch_lines(report)
    assert lines[1].endswith(f"({package}>=1; not applied, {package} not installed)")
    assert report.problems == []
