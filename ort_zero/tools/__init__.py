"""Offline tools over what ort_zero records: comparing two runs' activation statistics, describing a recompute."""

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
from .recompute_summary import describe_recompute, recompute_applied

__all__ = [
    "Activation",
    "ActivationDiff",
    "DumpError",
    "FieldDiff",
    "RunComparison",
    "RunDump",
    "StepComparison",
    "compare_runs",
    "describe_recompute",
    "format_markdown",
    "format_text",
    "load_run",
    "recompute_applied",
]
