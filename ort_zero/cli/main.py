"""The `ort-zero` console script.

Only the chosen subcommand's module is imported, so a broken onnxruntime or DeepSpeed install cannot break
`ort-zero doctor`, the command that diagnoses it. Each subcommand module exposes
`add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

COMMANDS = {
    "doctor": "check the installed stack (versions, ORTModule extensions, DeepSpeed accelerator, MPI)",
    "compare": "compare a PyTorch run with an ORT run (losses, activations)",
    "converge": "train the same job in PyTorch and in ORT and check the loss curves agree",
    "deepspeed-tests": "run DeepSpeed's own unit tests natively and with ort_zero's hooks; print what differs",
    "configs": "list the DeepSpeed and accelerate configs ort_zero ships, or copy them to edit",
    "universal-checkpoint": "convert a ZeRO-3 checkpoint so that it resumes on another number of ranks",
}


def load(command: str) -> ModuleType:
    return importlib.import_module(f"ort_zero.cli.{command.replace('-', '_')}")


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    """All subcommands are listed; only `chosen` is imported to add its own arguments."""
    parser = argparse.ArgumentParser(prog="ort-zero", description="DeepSpeed ZeRO-3 for ORTModule models.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            load(name).add_arguments(subparser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    try:
        parser = build_parser(chosen if chosen in COMMANDS else None)
    except ImportError as error:
        print(f"ort-zero {chosen}: cannot import it ({error}). Run 'ort-zero doctor'.", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    return load(args.command).run(args)


if __name__ == "__main__":
    sys.exit(main())
