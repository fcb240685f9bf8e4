"""The harness itself: timeouts and failures report the output, and nothing a run started survives it.

The "launcher" here is a Python one-liner that starts a child in a session of its own, as torchrun and mpirun do
with their ranks, so killing the launcher's process group alone would miss it.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from launcher import free_port, run_launcher

DETACHED_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open(sys.argv[1], "w").write(str(child.pid))
print("child started", flush=True)
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped by init) counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def run_detached(tmp_path: Path, sleep: float, exit_code: int, timeout: float) -> tuple[int, str | None]:
    """Run the one-liner; return the detached child's pid and the harness's error message, if any."""
    pid_file = tmp_path / "child.pid"
    argv = [sys.executable, "-c", DETACHED_CHILD, str(pid_file), str(sleep), str(exit_code)]
    try:
        run_launcher(argv, timeout=timeout)
        error = None
    except AssertionError as raised:
        error = str(raised)
    return int(pid_file.read_text()), error


def assert_gone(pid: int) -> None:
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), f"process {pid} outlived the run"


def test_success_returns_and_leaves_nothing(tmp_path: Path) -> None:
    pid, error = run_detached(tmp_path, sleep=0, exit_code=0, timeout=60)
    assert error is None
    assert_gone(pid)


def test_failure_reports_exit_code_and_output(tmp_path: Path) -> None:
    pid, error = run_detached(tmp_path, sleep=0, exit_code=3, timeout=60)
    assert error is not None and "exit code 3" in error and "child started" in error
    assert_gone(pid)


def test_timeout_kills_everything_and_reports_output(tmp_path: Path) -> None:
    started = time.monotonic()
    pid, error = run_detached(tmp_path, sleep=600, exit_code=0, timeout=5)
    assert error is not None and "timed out after 5s" in error and "child started" in error
    assert time.monotonic() - started < 30
    assert_gone(pid)


def test_free_port_is_bindable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
