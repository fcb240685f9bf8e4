"""What `ort-zero doctor` prints and finds, shared by its checks (`doctor`, `doctor_cuda`)."""

from __future__ import annotations

from collections.abc import Callable


class Report:
    """Lines to print and the reasons the stack is not usable."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def line(self, label: str, text: str) -> None:
        print(f"{label + ':' if label else '':<22}{text}", flush=True)

    def problem(self, reason: str) -> None:
        self.problems.append(reason)

    def probe(self, label: str, body: Callable[[Report], str | list[str]]) -> None:
        """Print `body`'s line(s); if it raises, print the error instead and count it as a problem."""
        try:
            text = body(self)
            for i, line in enumerate([text] if isinstance(text, str) else text):
                self.line(label if i == 0 else "", line)
        except Exception as error:  # noqa: BLE001 - any failure is a finding to print, not a crash
            message = f"{type(error).__name__}: {error}".splitlines()[0]
            self.line(label, f"ERROR {message}")
            self.problem(f"{label} failed ({message})")
