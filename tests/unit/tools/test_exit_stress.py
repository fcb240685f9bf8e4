"""ort_zero.tools.exit_stress: how a launch is counted (the runs themselves are made by hand, not in CI)."""

from __future__ import annotations

from ort_zero.tools.exit_stress import outcome

# torchrun's report of a rank that gloo aborted at exit (torch 2.14), cut to its telling lines
ABORTED = """terminate called without an active exception
[rank1]: ...
  exitcode  : -6 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 4242"""


def test_a_clean_exit_an_abort_and_another_failure_are_told_apart() -> None:
    assert outcome(0, "") == "clean"
    assert outcome(1, ABORTED) == "abort"
    assert outcome(1, ABORTED.replace("terminate called without an active exception\n", "")) == "abort"
    assert outcome(1, "  exitcode  : 1 (pid: 4242)\nRuntimeError: lost contact") == "failed"
    assert outcome(None, "") == "failed"  # a timeout
