"""`ort-zero deepspeed-tests`: DeepSpeed's own unit tests, natively and with ort_zero's ZeRO-3 hooks in every process.

    ort-zero deepspeed-tests /path/to/DeepSpeed/tests [FILE ...] [--local-size 2] [--out DIR]

FILEs are paths under that `tests/` directory (a DeepSpeed source checkout; nothing of it is copied here), by
default the ZeRO-3 files in DEFAULT_FILES. Each run is one pytest process in that directory with its own
pytest.ini, `DS_ACCELERATOR=cpu` and a 2-rank-capable world (`--local-size 2`: DeepSpeed's CPU accelerator reports
one device otherwise, so its `world_size=2` tests skip). The patched run puts a `sitecustomize.py` on PYTHONPATH
that calls `ort_zero.enable_zero3()` at interpreter start, so DeepSpeed's spawned and forkserver workers get the
hooks too; each process records whether ort_zero was enabled and how many engines ort_zero's hooks set up, and the
run counts as patched only if some did. Prints per-file counts for both runs and every test whose outcome differs;
exits 1 when any does.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FILES = [
    "unit/v1/zero/test_zero_activation_checkpoint_lifecycle.py",
    "unit/runtime/zero/test_zero_context_return.py",
    "unit/runtime/zero/test_zero_context.py",
    "unit/runtime/zero/test_zero_context_ancestry.py",
    "unit/runtime/zero/test_zero_dynamic_class.py",
    "unit/runtime/zero/test_ignore_unused_parameters.py",
    "unit/v1/zero/test_zero_user_backward.py",
]
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed")
RECORD_DIR = "ORT_ZERO_DS_TESTS_RECORD"
# Runs at interpreter start in every process of the patched run; counts engines set up by ort_zero's hooks.
SITECUSTOMIZE = f'''
import os
from pathlib import Path

import ort_zero
import ort_zero.zero3.install as _install

_record = Path(os.environ["{RECORD_DIR}"]) / f"{{os.getpid()}}"
_setup = _install.setup_zero_stage3_hooks


def _counted_setup(offload):
    _setup(offload)
    with open(_record, "a") as record:
        record.write("hooked %d\\n" % hasattr(offload, "ort_zero_subscriber"))


_install.setup_zero_stage3_hooks = _counted_setup  # before enable_zero3, which installs it into DeepSpeed
ort_zero.enable_zero3()
with open(_record, "a") as record:
    record.write("enabled %d\\n" % ort_zero.is_zero3_enabled())
'''


@dataclass
class PytestRun:
    """One pytest run: each test's outcome and failure message, and (patched runs) the processes' records."""

    outcomes: dict[str, tuple[str, str]]  # test id -> (outcome, first line of the message)
    enabled_processes: int = 0
    hooked_engines: int = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tests", type=Path, help="the tests/ directory of a DeepSpeed source checkout")
    parser.add_argument("files", nargs="*", help=f"test files under it (default: {len(DEFAULT_FILES)} ZeRO files)")
    parser.add_argument("--local-size", type=int, default=2, help="devices DeepSpeed's CPU accelerator reports")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per run before it is stopped")
    parser.add_argument("--out", type=Path, default=None, help="keep JUnit XML and logs here (default: temporary)")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")


def run(args: argparse.Namespace) -> int:
    tests = args.tests.resolve()
    files = args.files or DEFAULT_FILES
    missing = [f for f in files if not (tests / f).is_file()]
    if not (tests / "unit" / "common.py").is_file() or missing:
        print(f"ort-zero deepspeed-tests: {tests} is not DeepSpeed's tests/ or lacks {missing}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ort_zero_ds_tests_") as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        runs = {mode: run_pytest(tests, files, mode, out, args) for mode in ("native", "patched")}
    print(format_report(files, runs["native"], runs["patched"]))
    if runs["patched"].hooked_engines == 0:
        print("ort-zero deepspeed-tests: ort_zero's hooks set up no engine in the patched run", file=sys.stderr)
        return 2
    return int(differences(runs["native"], runs["patched"]) != [])


def run_pytest(tests: Path, files: list[str], mode: str, out: Path, args: argparse.Namespace) -> PytestRun:
    """pytest over `files` in DeepSpeed's tests directory; the patched mode with ort_zero enabled in every process."""
    from ..tools.process_tree import TaggedProcessTree

    junit, record = out / f"{mode}.xml", out / f"{mode}_processes"
    record.mkdir(exist_ok=True)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "LOCAL_SIZE": str(args.local_size), "TORCH_WARM_POOL": "0"}
    if mode == "patched":
        site = out / "sitecustomize"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
        env[RECORD_DIR] = str(record)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", "-q", *files]
    if args.keyword:
        argv += ["-k", args.keyword]
    print(f"[{mode}] {' '.join(argv[3:])}", file=sys.stderr, flush=True)
    with open(out / f"{mode}.log", "w") as log, TaggedProcessTree(argv, stdout=log, env=env, cwd=tests) as tree:
        if tree.wait(args.timeout) is None:
            raise SystemExit(f"ort-zero deepspeed-tests: {mode} run over {args.timeout:.0f}s (log: {log.name})")
    if not junit.is_file():
        raise SystemExit(f"ort-zero deepspeed-tests: the {mode} run wrote no results (see {out / f'{mode}.log'})")
    lines = [line.split() for path in record.iterdir() for line in path.read_text().splitlines()]
    return PytestRun(
        outcomes=read_junit(junit.read_text(), files),
        enabled_processes=sum(1 for name, value in lines if name == "enabled" and value == "1"),
        hooked_engines=sum(1 for name, value in lines if name == "hooked" and value == "1"),
    )


def read_junit(xml: str, files: list[str]) -> dict[str, tuple[str, str]]:
    """Test id (`file::Class::name`) -> (outcome, first line of its message), from pytest's JUnit XML (which names a
    test's file and class as one dotted `classname`)."""
    modules = {file.removesuffix(".py").replace("/", "."): file for file in files}
    outcomes = {}
    for case in ElementTree.fromstring(xml).iter("testcase"):
        classname = case.get("classname", "")
        module = max((m for m in modules if classname == m or classname.startswith(m + ".")), key=len, default=None)
        if module is None:
            continue
        test_id = "::".join(filter(None, [modules[module], classname[len(module) + 1 :], case.get("name", "")]))
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                if child.tag == "skipped" and child.get("type") == "pytest.xfail":
                    outcome = "xfailed"
                message = next(iter((child.get("message") or child.text or "").strip().splitlines()), "")
                break
        outcomes[test_id] = (outcome, message)
    return outcomes


def counts(result: PytestRun, file: str) -> Counter[str]:
    return Counter(outcome for test_id, (outcome, _) in result.outcomes.items() if test_id.startswith(file + "::"))


def differences(native: PytestRun, patched: PytestRun) -> list[tuple[str, str, str, str]]:
    """(test id, native outcome, patched outcome, patched message) wherever the two runs disagree."""
    rows = []
    for test_id in sorted(native.outcomes.keys() | patched.outcomes.keys()):
        before, after = native.outcomes.get(test_id, ("absent", "")), patched.outcomes.get(test_id, ("absent", ""))
        if before[0] != after[0]:
            rows.append((test_id, before[0], after[0], after[1]))
    return rows


def format_report(files: list[str], native: PytestRun, patched: PytestRun) -> str:
    def cell(counter: Counter[str]) -> str:
        return " ".join(f"{counter[o]} {o}" for o in OUTCOMES if counter[o]) or "no tests"

    lines = [
        f"patched run: ort_zero enabled in {patched.enabled_processes} processes, "
        f"its hooks set up {patched.hooked_engines} DeepSpeed engines",
        "",
        "| file | native | patched |",
        "|---|---|---|",
    ]
    lines += [f"| {file} | {cell(counts(native, file))} | {cell(counts(patched, file))} |" for file in files]
    diff = differences(native, patched)
    lines += ["", f"{len(diff)} tests differ" + (":" if diff else "")]
    lines += [f"  {test_id}: native {before}, patched {after}  {message}" for test_id, before, after, message in diff]
    return "\n".join(lines)
