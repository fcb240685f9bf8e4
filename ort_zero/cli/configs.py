"""`ort-zero configs`: the DeepSpeed and accelerate configs ort_zero ships, where the installed package keeps them,
and a copy of them to edit (`--copy DIR`). The tools and examples also take a shipped config by its name."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from ort_zero import configs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--copy", type=Path, metavar="DIR", help="copy them (and their README) into DIR")


def run(args: argparse.Namespace) -> int:
    if args.copy is None:
        print(f"# {configs.folder()}")
        for name in configs.names():
            print(name)
        return 0
    args.copy.mkdir(parents=True, exist_ok=True)
    taken = [name for name in [*configs.names(), "README.md"] if (args.copy / name).exists()]
    if taken:
        print(f"ort-zero configs: {args.copy} already has {', '.join(taken)}; nothing copied", file=sys.stderr)
        return 1
    for name in [*configs.names(), "README.md"]:
        shutil.copyfile(configs.folder() / name, args.copy / name)
    print(f"copied {len(configs.names())} configs and their README into {args.copy}")
    return 0
