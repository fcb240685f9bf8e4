"""Which causal LM types train in ONNX Runtime under ZeRO-3: every type in transformers'
`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, tiny from config, trained a few steps by native DeepSpeed ZeRO-3 and by
ORT-ZeRO3 in the same process, per-step losses compared. Run by hand (about 30 minutes on 2 cores), not in CI:

    .venv/bin/python -m ort_zero.tools.causal_lm_sweep --out runs/sweep [--types llama,gpt2] [--attn sdpa]

One worker process (one rank, gloo) goes through the types and appends a JSON line per type to
`<out>/results.jsonl`; when it dies (a crash inside ORT) or a type takes longer than --timeout, the driver records
that type and starts a new worker on the rest. `<out>/table.md` is the table the README shows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

TOLERANCE = 1e-5
STEPS = 3
STARTED = "started"  # the worker's line before a type: a worker that dies leaves it as the last line


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
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per type")
    parser.add_argument("--max-rss-gib", type=float, default=8.0, help="a worker above this is stopped (that type)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def all_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


# ---- worker: one process, types one after the other -------------------------------------------------------------


def _ds_config() -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _batches(steps: int, seq_len: int = 32, codebooks: int | None = None) -> list[dict[str, Any]]:
    """Token batches of 2 sequences, labels the inputs (the model shifts them). A model over `codebooks` parallel
    token streams (MusicGen's decoder: `config.num_codebooks`) takes the streams of each sequence as rows of
    input_ids, (batch * codebooks, seq), and labels per position and codebook, (batch, seq, codebooks)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(steps):
        if codebooks:
            codes = torch.randint(3, 256, (2, codebooks, seq_len), generator=generator)
            ids, labels = codes.reshape(-1, seq_len), codes.transpose(1, 2).clone()
            mask = torch.ones(2, seq_len, dtype=torch.long)
        else:
            ids = torch.randint(3, 256, (2, seq_len), generator=generator)
            labels, mask = ids.clone(), torch.ones_like(ids)
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


def codebooks_of(built_from: Any, model_config: Any) -> int | None:
    """The parallel codebooks a model's batches carry: only a decoder built from part of a composite config
    (MusicGen's) takes them; a model over the whole config it was built from takes token batches, even where that
    config names codebooks (Moshi's, for its audio depth decoder; its causal LM reads text)."""
    if model_config.model_type == built_from.model_type:
        return None
    return getattr(model_config, "num_codebooks", None)


def _train(model_type: str, attn: str, steps: int, in_ort: bool) -> tuple[list[float], dict[str, Any]]:
    """Per-step losses of one tiny model of `model_type`, native ZeRO-3 or ORT-ZeRO3, and ORT's run record."""
    import deepspeed
    from transformers import set_seed
    from transformers.integrations import HfDeepSpeedConfig

    from ort_zero import api
    from ort_zero.examples.hf_models import causal_lm_from_config, model_config
    from ort_zero.foreign.transformers import attention_implementation

    sizes = argparse.Namespace(model_type=model_type, hidden_size=32, layers=2, heads=4, seq_len=32)
    if in_ort:
        api.enable_zero3()
    else:
        api.disable_zero3()
    set_seed(1234)
    config = _ds_config()
    zero3 = HfDeepSpeedConfig(config)  # noqa: F841 - while it lives, from_config builds under zero.Init as the Trainer's
    implementation = None if attn == "default" else attn
    built_from = model_config(sizes)
    model = causal_lm_from_config(built_from, attn_implementation=implementation)
    used = attention_implementation(model)
    codebooks = codebooks_of(built_from, model.config)
    if in_ort:
        from onnxruntime.training.ortmodule import ORTModule

        model = ORTModule(model)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    losses = []
    for batch in _batches(steps, codebooks=codebooks):
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    record = {"attn_implementation": used}
    if in_ort:
        from ort_zero.ort.inspection import ort_run_record

        record.update(ort_run_record(model)["training"])
    engine.destroy()
    return losses, record


def _one_line(error: BaseException) -> str:
    """The error on one line: ort_zero's own message where ORT's wraps it (with a traceback), else the error, a long
    one (ORT's start with a source path) cut to its start and its end."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    own = text.find("ort_zero: ")
    if own >= 0:
        text = text[own:].split(" Ways out:")[0]
    return text if len(text) <= 320 else f"{text[:100]} ... {text[-200:]}"


def _sweep_one(model_type: str, attn: str, steps: int) -> dict[str, Any]:
    result: dict[str, Any] = {"type": model_type, "attn": attn}
    try:
        result["native"], native_record = _train(model_type, attn, steps, in_ort=False)
        result["attn_implementation"] = native_record["attn_implementation"]
    except Exception as error:  # noqa: BLE001 - the sweep reports every failure as a result
        return {**result, "status": "native fails", "error": _one_line(error), "trace": traceback.format_exc()[-2000:]}
    if not all(math.isfinite(loss) for loss in result["native"]):  # nothing for ORT to agree with
        return {**result, "status": "native fails", "error": f"native ZeRO-3's losses are {result['native']}"}
    try:
        result["ort"], record = _train(model_type, attn, steps, in_ort=True)
    except Exception as error:  # noqa: BLE001
        return {**result, "status": "ORT fails", "error": _one_line(error), "trace": traceback.format_exc()[-2000:]}
    ran = bool(record.get("session")) and "ort_zero.zero3.bridges.PreForwardBridge" in record.get("python_ops", [])
    diff = max(abs(a - b) for a, b in zip(result["native"], result["ort"], strict=True))
    result["max_loss_diff"] = diff
    if not ran:
        result["status"] = "not in ORT"
    else:
        result["status"] = "trains" if diff <= TOLERANCE else "losses differ"
    return result


def work(args: argparse.Namespace) -> None:
    import logging
    import warnings

    from ort_zero.distributed import init_distributed, shut_down_distributed

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    init_distributed()
    results = args.out / "results.jsonl"
    for model_type in args.types.split(","):
        append_result(results, {"type": model_type, "status": STARTED, "attn": args.attn})
        began = time.perf_counter()
        result = _sweep_one(model_type, args.attn, args.steps)
        result["seconds"] = round(time.perf_counter() - began, 1)
        append_result(results, result)
    shut_down_distributed()


# ---- driver -------------------------------------------------------------------------------------------------------


def append_result(path: Path, entry: dict[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(entry) + "\n")


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
        with (args.out / "worker.log").open("a") as log:
            worker = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            _watch(worker, results_path, args.timeout, args.max_rss_gib)
    write_table(read_results(results_path), wanted, args.out / "table.md")
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


def write_table(results: dict[str, dict[str, Any]], wanted: list[str], path: Path) -> None:
    rows = [results[t] for t in wanted if t in results]
    trains = sum(r["status"] == "trains" for r in rows)
    lines = [
        f"{trains} of {len(rows)} types train in ORT with native ZeRO-3's losses (within {TOLERANCE:g}).",
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
