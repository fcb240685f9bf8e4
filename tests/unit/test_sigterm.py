"""SIGTERM as a noted request to stop (ort_zero/sigterm.py): the process lives on, the stop is agreed at a step's end,
and after it SIGTERM stays ignored (one process; the agreement between ranks: tests/distributed/test_preemption.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from ort_zero.sigterm import StopRequest


@pytest.fixture(autouse=True)
def sigterm_handler_restored() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def send_sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # Python runs the handler at the next bytecode in the main thread


def test_sigterm_is_noted_and_the_stop_agreed_at_the_step_end() -> None:
    with StopRequest() as stop:
        assert not stop.agreed()
        send_sigterm()  # the test process lives on
        assert stop.signalled and stop.agreed()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN, "a later SIGTERM could cut the save or exit short"


def test_without_sigterm_the_previous_handler_comes_back() -> None:
    def previous(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, previous)
    with StopRequest() as stop:
        assert signal.getsignal(signal.SIGTERM) not in (previous, signal.SIG_DFL)
        assert not stop.agreed()
    assert signal.getsignal(signal.SIGTERM) is previous
