"""`ort-zero compare RUN_A RUN_B`: where do two runs' activation statistics first differ?

RUN_A and RUN_B are the `output_dir`s of `StatisticsSubscriber` in two runs of the same job (typically PyTorch and
ORT). Prints one line per step and the first differing step and activation in forward order; `--output` also
writes a Markdown summary. Exit status: 0 all within tolerance, 1 they differ, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..tools.activation_summary import DumpError, compare_runs, format_markdown, format_text, load_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="statistics folder of the reference run")
    parser.add_argument("run_b", type=Path, metavar="RUN_B", help="statistics folder of the run to check")
    parser.add_argument("--rank", type=int, default=0, help="which rank's dumps to compare (default 0)")
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default 1e-4)")
    parser.add_argument("--atol", type=float, default=1e-6, help="absolute tolerance (default 1e-6)")
    parser.add_argument("--output", type=Path, help="also write the summary here, as Markdown")


def run(args: argparse.Namespace) -> int:
    if args.rtol < 0 or args.atol < 0:
        return _bad_input(f"tolerances must not be negative (--rtol {args.rtol}, --atol {args.atol})")
    try:
        run_a, run_b = load_run(args.run_a, args.rank), load_run(args.run_b, args.rank)
    except DumpError as error:
        return _bad_input(str(error))
    comparison = compare_runs(run_a, run_b, rtol=args.rtol, atol=args.atol)
    if comparison.compared == 0:
        return _bad_input(f"the runs have no step and activation in common: {args.run_a} vs {args.run_b}")
    print(format_text(comparison))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(format_markdown(comparison), encoding="utf-8")
        print(f"summary: {args.output}")
    return 0 if comparison.within_tolerance else 1


def _bad_input(message: str) -> int:
    print(f"ort-zero compare: error: {message}", file=sys.stderr)
    return 2
