"""Which causal LM types train in ONNX Runtime under ZeRO-3: every type in transformers'
`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, tiny from config, trained a few steps by native DeepSpeed ZeRO-3 and by
ORT-ZeRO3 in the same process, per-step losses compared. Run by hand (about 30 minutes on 2 cores), not in CI:

    .venv/bin/python -m ort_zero.tools.causal_lm_sweep --out runs/sweep [--types llama,gpt2] [--attn sdpa]
        [--precision bf16]

One worker process (`causal_lm_worker`: one rank, gloo) goes through the types and appends a JSON line per type to
`<out>/results.jsonl`; when it dies (a crash inside ORT) or a type takes longer than --timeout, the driver records
that type and starts a new worker on the rest. `<out>/table.md` is the table the README shows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ort_zero.tools.causal_lm_worker import STARTED, STEPS, append_result, tolerance_said, work


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m ort_zero.tools.causal_lm_sweep", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("runs/causal_lm_sweep"))
    parser.add_argument("--types", default="", help="comma-separated types (default: all)")
    parser.add_argument(
        "--attn", default="default", help="attention implementation; default: from_pretrained's (sdpa where it exists)"
    )
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="the DeepSpeed config's bf16 on")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per type")
    parser.add_argument("--max-rss-gib", type=float, default=8.0, help="a worker above this is stopped (that type)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def all_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def read_results(path: Path) -> dict[str, dict[str, Any]]:
    """The last line per type (a type whose worker died keeps its `started` line)."""
    if not path.exists():
        return {}
    results: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            results[entry["type"]] = entry
    return results


def drive(args: argparse.Namespace) -> None:
    from ort_zero.tools.process_tree import free_port

    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.jsonl"
    wanted = args.types.split(",") if args.types else all_types()
    while True:
        results = read_results(results_path)
        for entry in results.values():  # a worker died in this type
            if entry["status"] == STARTED:
                append_result(results_path, {**entry, "status": "crashes", "error": "the worker died (see worker.log)"})
        results = read_results(results_path)
        todo = [t for t in wanted if t not in results]
        if not todo:
            break
        env = {
            **os.environ,
            "DS_ACCELERATOR": "cpu",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        command = [sys.executable, "-m", "ort_zero.tools.causal_lm_sweep", "--worker", "--out", str(args.out)]
        command += ["--types", ",".join(todo), "--attn", args.attn, "--steps", str(args.steps)]
        command += ["--precision", args.precision]
        with (args.out / "worker.log").open("a") as log:
            worker = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            _watch(worker, results_path, args.timeout, args.max_rss_gib)
    write_table(read_results(results_path), wanted, args.out / "table.md", args.precision)
    print((args.out / "table.md").read_text())


def _watch(worker: subprocess.Popen, results_path: Path, timeout: float, max_rss_gib: float) -> None:
    """Wait for the worker; stop it when one type runs past `timeout` or above `max_rss_gib` (that type is then
    recorded)."""
    current, since = None, time.monotonic()
    while worker.poll() is None:
        time.sleep(1.0)
        lines = results_path.read_text().splitlines() if results_path.exists() else []
        last = json.loads(lines[-1]) if lines else None
        if last != current:
            current, since = last, time.monotonic()
        if not last or last["status"] != STARTED:
            continue
        rss = _rss_gib(worker.pid)
        if time.monotonic() - since > timeout or rss > max_rss_gib:
            worker.kill()
            worker.wait()
            too_much = f"above {max_rss_gib:g} GiB of RSS" if rss > max_rss_gib else f"over {timeout:.0f} s"
            append_result(results_path, {**last, "status": "stopped", "error": f"the worker was stopped: {too_much}"})


def _rss_gib(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        return 0.0


def write_table(results: dict[str, dict[str, Any]], wanted: list[str], path: Path, precision: str = "fp32") -> None:
    rows = [results[t] for t in wanted if t in results]
    trains = sum(r["status"] == "trains" for r in rows)
    lines = [
        f"{trains} of {len(rows)} types train in ORT with native ZeRO-3's losses ({tolerance_said(precision)}).",
        "",
        "| type | attention | result | max loss diff | note |",
        "|---|---|---|---:|---|",
    ]
    for row in rows:
        diff = row.get("max_loss_diff")
        note = row.get("error", "").replace("|", "\\|")[:160]
        attn = row.get("attn_implementation", "")
        shown = "" if diff is None else f"{diff:.1e}"
        lines.append(f"| {row['type']} | {attn} | {row['status']} | {shown} | {note} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        work(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
