"""How often a plain 2-rank Trainer script fails to exit cleanly: the README's recipe (`ort_zero.examples.
readme_trainer`, no shut-down at its end) under torchrun, N times; each run is counted as clean (exit 0), an abort
(a rank killed by SIGABRT: gloo's "terminate called without an active exception" at interpreter exit) or another
failure. Run by hand, not in CI (a run takes ~25 s on 2 cores); the ort_zero on PYTHONPATH is the one measured.

    OMP_NUM_THREADS=1 python -m ort_zero.tools.exit_stress --runs 30 --out runs/exit_stress.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path

from ort_zero.tools.process_tree import TaggedProcessTree, free_port

ABORT_MESSAGE = "terminate called without an active exception"
TIMEOUT_S = 600.0


def outcome(returncode: int | None, output: str) -> str:
    """ "clean", "abort" or "failed" (a timeout, or any other non-zero exit) for one launch."""
    if returncode == 0:
        return "clean"
    # torchrun reports a rank killed by a signal as "exitcode  : -6 (pid: ...)" and exits 1 itself
    if ABORT_MESSAGE in output or f"exitcode  : -{signal.SIGABRT.value} " in output:
        return "abort"
    return "failed"


def run_once(output_dir: Path, script: Path | None = None) -> tuple[str, str]:
    """One launch of `script` (default: the README's recipe), its outcome and output."""
    program = [str(script)] if script is not None else ["-m", "ort_zero.examples.readme_trainer"]
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
        f"--master_port={free_port()}", *program, "--output-dir", str(output_dir),
    ]  # fmt: skip
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"}
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        tree = TaggedProcessTree(argv, stdout=log, env=env)
        returncode = tree.wait(TIMEOUT_S)
        tree.stop()
        log.seek(0)
        output = log.read()
    return outcome(returncode, output), output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ort_zero.tools.exit_stress", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out", type=Path, help="JSON: each run's outcome, the counts, the failures' output tails")
    parser.add_argument("--script", type=Path, help="another Trainer script taking --output-dir (e.g. an older one)")
    args = parser.parse_args(argv)

    outcomes, tails = [], {}
    with tempfile.TemporaryDirectory() as work:
        for run in range(args.runs):
            result, output = run_once(Path(work) / f"run{run}", args.script)
            outcomes.append(result)
            if result != "clean":
                tails[run] = output[-3000:]
            print(f"run {run + 1}/{args.runs}: {result}", flush=True)
    counts = Counter(outcomes)
    print(f"{counts['clean']} clean, {counts['abort']} aborts, {counts['failed']} other failures in {args.runs} runs")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"runs": args.runs, "counts": dict(counts), "outcomes": outcomes, "failure_tails": tails}
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if counts["clean"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
