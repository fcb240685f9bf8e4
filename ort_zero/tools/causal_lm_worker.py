"""The causal-LM sweep's worker (`causal_lm_sweep`): one process, one CPU rank, the types one after the other, each
trained a few steps by native DeepSpeed ZeRO-3 and by ORT-ZeRO3, a JSON line per type."""

from __future__ import annotations

import argparse
import json
import math
import time
import traceback
from pathlib import Path
from typing import Any

STEPS = 3
STARTED = "started"  # the worker's line before a type: a worker that dies leaves it as the last line
ABSOLUTE_TOLERANCE = 1e-5  # float32: per-step losses this close
BF16_RELATIVE_TOLERANCE = 2**-6  # bf16: two units in the last place at the type's coarsest relative spacing


def within_tolerance(native: list[float], ort: list[float], precision: str) -> bool:
    if precision == "bf16":
        return all(abs(a - b) <= BF16_RELATIVE_TOLERANCE * abs(a) for a, b in zip(native, ort, strict=True))
    return all(abs(a - b) <= ABSOLUTE_TOLERANCE for a, b in zip(native, ort, strict=True))


def tolerance_said(precision: str) -> str:
    if precision == "bf16":
        return f"in bf16, within {BF16_RELATIVE_TOLERANCE:g} relative: two bf16 units in the last place"
    return f"within {ABSOLUTE_TOLERANCE:g}"


def ds_config(precision: str) -> dict[str, Any]:
    return {
        **({"bf16": {"enabled": True}} if precision == "bf16" else {}),
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def batches(steps: int, seq_len: int = 32, codebooks: int | None = None) -> list[dict[str, Any]]:
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


def train(model_type: str, attn: str, steps: int, in_ort: bool, precision: str) -> tuple[list[float], dict[str, Any]]:
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
    config = ds_config(precision)
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
    for batch in batches(steps, codebooks=codebooks):
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


def one_line(error: BaseException) -> str:
    """The error on one line: ort_zero's own message where ORT's wraps it (with a traceback), else the error, a long
    one (ORT's start with a source path) cut to its start and its end."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    own = text.find("ort_zero: ")
    if own >= 0:
        text = text[own:].split(" Ways out:")[0]
    return text if len(text) <= 320 else f"{text[:100]} ... {text[-200:]}"


def sweep_one(model_type: str, attn: str, steps: int, precision: str) -> dict[str, Any]:
    result: dict[str, Any] = {"type": model_type, "attn": attn}
    try:
        result["native"], native_record = train(model_type, attn, steps, False, precision)
        result["attn_implementation"] = native_record["attn_implementation"]
    except Exception as error:  # noqa: BLE001 - the sweep reports every failure as a result
        return {**result, "status": "native fails", "error": one_line(error), "trace": traceback.format_exc()[-2000:]}
    if not all(math.isfinite(loss) for loss in result["native"]):  # nothing for ORT to agree with
        return {**result, "status": "native fails", "error": f"native ZeRO-3's losses are {result['native']}"}
    try:
        result["ort"], record = train(model_type, attn, steps, True, precision)
    except Exception as error:  # noqa: BLE001
        return {**result, "status": "ORT fails", "error": one_line(error), "trace": traceback.format_exc()[-2000:]}
    ran = bool(record.get("session")) and "ort_zero.zero3.bridges.PreForwardBridge" in record.get("python_ops", [])
    diff = max(abs(a - b) for a, b in zip(result["native"], result["ort"], strict=True))
    result["max_loss_diff"] = diff
    if not ran:
        result["status"] = "not in ORT"
    else:
        result["status"] = "trains" if within_tolerance(result["native"], result["ort"], precision) else "losses differ"
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
        result = sweep_one(model_type, args.attn, args.steps, args.precision)
        result["seconds"] = round(time.perf_counter() - began, 1)
        append_result(results, result)
    shut_down_distributed()


def append_result(path: Path, entry: dict[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(entry) + "\n")
