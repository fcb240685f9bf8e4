"""`ort-zero deepspeed-tests`: reading pytest's JUnit XML per DeepSpeed test file, and the report of differences."""

from __future__ import annotations

from pathlib import Path

from ort_zero.cli.deepspeed_tests import SITECUSTOMIZE, PytestRun, differences, format_report, read_junit

FILES = ["unit/v1/zero/test_a.py", "unit/runtime/zero/test_b.py"]
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="unit.v1.zero.test_a.TestA" name="test_ok" />
  <testcase classname="unit.v1.zero.test_a.TestA" name="test_param[True]">
    <failure message="AttributeError: 'Tensor' object has no attribute 'ds_param_alias'&#10;more">trace</failure>
  </testcase>
  <testcase classname="unit.v1.zero.test_a.TestA" name="test_later">
    <skipped type="pytest.xfail" message="x" />
  </testcase>
  <testcase classname="unit.runtime.zero.test_b" name="test_module_level"><skipped message="needs 2 GPUs" /></testcase>
  <testcase classname="unit.other.test_c" name="test_not_chosen" />
</testsuite></testsuites>
"""


def test_outcomes_by_file_class_and_name_with_the_first_message_line() -> None:
    assert read_junit(JUNIT, FILES) == {
        "unit/v1/zero/test_a.py::TestA::test_ok": ("passed", ""),
        "unit/v1/zero/test_a.py::TestA::test_param[True]": (
            "failed",
            "AttributeError: 'Tensor' object has no attribute 'ds_param_alias'",
        ),
        "unit/v1/zero/test_a.py::TestA::test_later": ("xfailed", "x"),
        "unit/runtime/zero/test_b.py::test_module_level": ("skipped", "needs 2 GPUs"),
    }


def test_report_counts_per_file_and_lists_what_differs() -> None:
    patched = PytestRun(read_junit(JUNIT, FILES), enabled_processes=3, hooked_engines=2)
    native_outcomes = dict(patched.outcomes)
    native_outcomes["unit/v1/zero/test_a.py::TestA::test_param[True]"] = ("passed", "")
    native = PytestRun(native_outcomes)
    assert differences(native, patched) == [
        (
            "unit/v1/zero/test_a.py::TestA::test_param[True]",
            "passed",
            "failed",
            "AttributeError: 'Tensor' object has no attribute 'ds_param_alias'",
        )
    ]
    report = format_report(FILES, native, patched).splitlines()
    assert report[0] == "patched run: ort_zero enabled in 3 processes, its hooks set up 2 DeepSpeed engines"
    assert "| unit/v1/zero/test_a.py | 2 passed 1 xfailed | 1 passed 1 failed 1 xfailed |" in report
    assert "| unit/runtime/zero/test_b.py | 1 skipped | 1 skipped |" in report
    assert "1 tests differ:" in report
    assert differences(native, native) == []


def test_sitecustomize_is_valid_python(tmp_path: Path) -> None:
    compile(SITECUSTOMIZE, str(tmp_path / "sitecustomize.py"), "exec")
