"""ort_zero installed as a wheel, not from a checkout: the tools find what they ship through the package.

Before the configs shipped as package data, `ort-zero converge` from an installed wheel stopped at once with
`DeepSpeed config not found: <site-packages>/ds_configs/zero3_cpu_fp32.json`. Here the wheel is built from this tree,
installed into a fresh venv that sees the stack of this one (a path file, so the editable ort_zero of this venv stays
out of reach), and its `ort-zero` runs from a directory that is not the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from launcher import run_launcher

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding ort_zero's wheel and a path to this venv's stack; its bin folder."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"  # setuptools writes build/ where it builds: not into the checkout
    shutil.copytree(ROOT / "ort_zero", source / "ort_zero", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "README.md"):
        shutil.copyfile(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(base / "dist"), str(source)], base)
    (wheel,) = (base / "dist").glob("ort_zero-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base)
    _run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "-q", str(wheel)], base)
    site_packages = next((venv / "lib").glob("python3.*/site-packages"))
    (site_packages / "the_stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def _outside_the_checkout(tmp_path: Path) -> Path:
    work = tmp_path / "elsewhere"
    work.mkdir()
    assert ROOT not in work.parents
    return work


@pytest.mark.extended
def test_the_installed_package_is_the_wheels_and_ships_its_configs(installed: Path, tmp_path: Path) -> None:
    work = _outside_the_checkout(tmp_path)
    where = _run([str(installed / "python"), "-c", "import ort_zero; print(ort_zero.__file__)"], work).stdout
    assert Path(where.strip()).is_relative_to(installed.parent), where  # not this checkout's editable install
    listed = _run([str(installed / "ort-zero"), "configs"], work).stdout.splitlines()
    assert Path(listed[0].removeprefix("# ")).is_relative_to(installed.parent), listed
    assert {"zero3_cpu_fp32.json", "zero3_hf_auto.json", "accelerate_zero3_cpu.yaml"} <= set(listed[1:]), listed
    _run([str(installed / "ort-zero"), "configs", "--copy", "mine"], work)
    assert json.loads((work / "mine" / "zero3_hf_auto.json").read_text())["zero_optimization"]["stage"] == 3


@pytest.mark.extended
def test_converge_runs_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    """Two steps of the README's main job, in PyTorch and in ORT, with the config the wheel ships."""
    work = _outside_the_checkout(tmp_path)
    argv = [str(installed / "ort-zero"), "converge", "--steps", "2", "--timeout", "300", "--output-dir", "run"]
    env = {"PATH": f"{installed}{os.pathsep}{os.environ['PATH']}"}
    result = run_launcher(argv, timeout=600, cwd=work, env=env)
    assert "[converge] AGREE" in result.stdout, result.stdout[-3000:]
    report = (work / "run" / "report.md").read_text()
    assert f"`{installed.parent}" in report, report  # the shipped config, read from the installed package
    assert json.loads((work / "run" / "ort" / "ort.json").read_text())["training"]["session"]
