"""`ort-zero compare RUN_A RUN_B`: where do two runs first differ?

RUN_A and RUN_B are either run records (`integrations.run_record`: any DeepSpeed run, any ZeRO stage, world size,
precision or backend; the first step and the forward, backward or optimizer step and layer where they part) or the
`output_dir`s of `StatisticsSubscriber` in two runs of the same job (the first step and activation in forward order).
`--output` also writes a Markdown summary (beside it, for records, a plot of each layer's gradient difference).
Exit status: 0 all within tolerance, 1 they differ, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..integrations.record_files import RECORD
from ..tools.activation_summary import DumpError, compare_runs, format_markdown, format_text, load_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="the reference run's record or statistics folder")
    parser.add_argument("run_b", type=Path, metavar="RUN_B", help="the other run's")
    parser.add_argument("--rank", type=int, default=0, help="statistics: which rank's dumps to compare (default 0)")
    parser.add_argument("--rtol", type=float, help="relative tolerance (records: from the precisions; else 1e-4)")
    parser.add_argument("--atol", type=float, default=1e-6, help="statistics: absolute tolerance (default 1e-6)")
    parser.add_argument("--output", type=Path, help="also write the summary here, as Markdown")


def run(args: argparse.Namespace) -> int:
    if (args.rtol is not None and args.rtol < 0) or args.atol < 0:
        return _bad_input(f"tolerances must not be negative (--rtol {args.rtol}, --atol {args.atol})")
    if (args.run_a / RECORD).is_file() or (args.run_b / RECORD).is_file():
        return _compare_records(args)
    try:
        run_a, run_b = load_run(args.run_a, args.rank), load_run(args.run_b, args.rank)
    except DumpError as error:
        return _bad_input(str(error))
    rtol = 1e-4 if args.rtol is None else args.rtol
    comparison = compare_runs(run_a, run_b, rtol=rtol, atol=args.atol)
    if comparison.compared == 0:
        return _bad_input(f"the runs have no step and activation in common: {args.run_a} vs {args.run_b}")
    print(format_text(comparison))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(format_markdown(comparison), encoding="utf-8")
        print(f"summary: {args.output}")
    return 0 if comparison.within_tolerance else 1


def _compare_records(args: argparse.Namespace) -> int:
    from ..tools import record_comparison, record_report  # matplotlib only for records

    try:
        a, b = record_comparison.load(args.run_a), record_comparison.load(args.run_b)
        comparison = record_comparison.compare(a, b, args.rtol)
    except record_comparison.RecordError as error:
        return _bad_input(str(error))
    print(record_report.verdict_line(comparison))
    if args.output is not None:
        record_report.write(comparison, args.output)
        print(f"summary: {args.output}")
    return 0 if comparison.parting is None else 1


def _bad_input(message: str) -> int:
    print(f"ort-zero compare: error: {message}", file=sys.stderr)
    return 2
