"""A launcher (torchrun, deepspeed, mpirun) as a process tree that can always be stopped, ranks included.

The launcher's process group is not enough: torchrun starts each rank in a session of its own. So the launcher runs
in a new session with a fresh tag in its environment, which every descendant inherits, and stopping signals the
group and every live process that carries the tag. Used by `ort-zero converge`, the benchmarks and the distributed
test harness, which also share `free_port`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO

TAG_VARIABLE = "ORT_ZERO_RUN_TAG"


def free_port() -> int:
    """A TCP port nothing listens on right now (the OS picks it) for a launcher's rendezvous on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TaggedProcessTree:
    """`argv` started in its own session, output to `stdout` (a file: a pipe could fill up unread)."""

    def __init__(
        self,
        argv: list[str],
        *,
        stdout: IO[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        grace_s: float = 5.0,
    ) -> None:
        self.argv = argv
        self.tag = uuid.uuid4().hex
        self.grace_s = grace_s
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**(os.environ if env is None else env), TAG_VARIABLE: self.tag},
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def __enter__(self) -> TaggedProcessTree:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def wait(self, timeout: float) -> int | None:
        """The launcher's exit code, or None when it is still running after `timeout` seconds (then call stop)."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """SIGTERM the group and every tagged process (launchers then stop their ranks), SIGKILL what is left after
        the grace period. Returns at once when everything has already exited."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self._alive():
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            for pid in self.tagged_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + self.grace_s
            while time.monotonic() < deadline and self._alive():
                time.sleep(0.1)

    def tagged_pids(self) -> list[int]:
        """Live processes whose environment carries this tree's tag."""
        marker = f"{TAG_VARIABLE}={self.tag}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
                    if marker in (entry / "environ").read_bytes().split(b"\0"):
                        pids.append(int(entry.name))
        return pids

    def _alive(self) -> bool:
        self.process.poll()  # reap the launcher: a zombie leader would keep its group alive
        return self.process.returncode is None or bool(self.tagged_pids()) or _group_alive(self.process.pid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
