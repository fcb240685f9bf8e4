"""Offline tools over what ort_zero's hooks record: comparing two runs' activation statistics."""

from .activation_summary import (
    Activation,
    ActivationDiff,
    DumpError,
    FieldDiff,
    RunComparison,
    RunDump,
    StepComparison,
    compare_runs,
    format_markdown,
    format_text,
    load_run,
)

__all__ = [
    "Activation",
    "ActivationDiff",
    "DumpError",
    "FieldDiff",
    "RunComparison",
    "RunDump",
    "StepComparison",
    "compare_runs",
    "format_markdown",
    "format_text",
    "load_run",
]
